// The native shard worker: serves layers [layer_start, layer_end) of a GGUF over the
// seam protocol (meshnet.shard.v1.Shard). Started and supervised by the node.
//
// Usage: worker --list_devices=1   (one JSON line per device it can compute on, then exit 0)
//        worker --model=PATH --node_id=ID --tracker_key=<64 hex>
//   (--tls_cert=PEM --tls_key=PEM | --insecure=1) [--layers=A:B] [--device=cpu|vulkan0|...]
//   [--listen=127.0.0.1:0]
//   [--threads=N] [--max_sessions=N] [--n_ctx=N] [--max_batch_tokens=N]
//   [--max_prefill_chunk=N] [--queue=N] [--batch_window_us=US] [--idle_seconds=S] [--unified_kv=0|1] [--reference_kernels=0|1]
//   [--f32_attention=0|1] [--f32_matmul_activations=0|1]
//   [--compression=0|1] [--max_threads=N] [--max_concurrent_streams=N]
//   [--ticket_deadline_ms=MS] [--max_step_ms=MS] [--connect_timeout_ms=MS] [--keepalive_ms=MS]
//   [--sampling_budget_ms=MS] [--heavy_draw_ms=MS] [--draw_threads=N] [--first_frame_ms=MS] [--max_stranger_streams=N]
//   [--max_stranger_streams_per_peer=N] [--handshake_timeout_ms=MS]
//   [--parent_pid=PID] [--commitments=0|1] [--cheat=noise:F|garbage|forge_tokens|skip_layer]   (--cheat: tests only)
// Route tickets are verified with the tracker's key (docs/adr/0003-identities-and-route-
// tickets.md); the shard service is served over TLS with the given certificate, or plaintext
// only with --insecure=1 (which also dials downstream hops in plaintext). Exits 2 on a missing
// or malformed flag. Prints {"event":"listening","port":N} on stdout once serving; SIGTERM or
// SIGINT drains (in-flight RPCs get up to 5 s) and exits 0. The server pings every connection
// that is quiet for --keepalive_ms and closes it when the ping is not answered within as long,
// so the sessions of a peer that vanished (host down, link cut, process stopped) are freed.
// With --parent_pid (the node's pid) the kernel kills the worker when its node dies
// (PR_SET_PDEATHSIG), and it exits at once if that parent is already gone: no orphan workers.
// $MESHNET_NODE_KEY (64 hex digits: the node's Ed25519 private key) signs the commitments that
// audits read (docs/adr/0008-verified-outputs.md). --cheat makes a cheating worker for tests of
// those audits (--commitments=0 keeps none: benchmarks of their cost only): it perturbs (noise:F of each row's RMS) or replaces (garbage) the hidden rows it
// hands on, forges the tokens it samples (forge_tokens), or runs its range without one of its
// layers (skip_layer), and commits to what it sends.
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "cpp/engine/devices.h"
#include "cpp/protocol/ticket.h"
#include "cpp/worker/flags.h"
#include "cpp/worker/scheduler/scheduler.h"
#include "cpp/worker/service.h"

namespace {

using meshnet::worker::IntFlag;
using meshnet::worker::ParseFlags;

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream text;
  text << in.rdbuf();
  *out = text.str();
  return !out->empty();
}

// `text` as a JSON string literal (a driver's description may hold any byte).
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// --list_devices=1: what the node sizes a range's KV by before it starts the worker (ADR 0014).
// Field names are Health's.
int ListDevices() {
  for (const meshnet::engine::DeviceInfo& device : meshnet::engine::ListDevices()) {
    std::cout << "{\"device\":" << JsonString(device.name)
              << ",\"device_description\":" << JsonString(device.description)
              << ",\"device_backend\":" << JsonString(device.backend)
              << ",\"device_memory_free\":" << device.memory_free
              << ",\"device_memory_total\":" << device.memory_total << "}\n";
  }
  return 0;
}

// The largest legal frame: one 1 MiB fragment plus 64 KiB of headers and tickets (ADR 0003).
constexpr int kMaxFrameBytes = (1 << 20) + (64 << 10);

}  // namespace

int main(int argc, char** argv) {
  // glibc gives every thread its own malloc arena; the service starts reader threads per
  // downstream session, so uncapped arenas make RSS creep across thousands of sessions
  // (measured in soak_test.cc). Two arenas keep it flat at no measurable cost here.
  mallopt(M_ARENA_MAX, 2);
  std::map<std::string, std::string> flags;
  const bool parsed = ParseFlags(argc, argv, "worker", &flags);
  if (parsed && IntFlag(flags, "list_devices", 0) != 0) return ListDevices();
  if (!parsed || !flags.count("model")) {
    std::cerr << "usage: worker --model=PATH --node_id=ID --tracker_key=HEX "
                 "(--tls_cert=PEM --tls_key=PEM | --insecure=1) [--layers=A:B] ...\n";
    return 2;
  }
  if (flags.count("parent_pid")) {
    const long parent = std::atol(flags["parent_pid"].c_str());
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
      std::cerr << "worker: parent " << parent << " is gone (or PR_SET_PDEATHSIG failed)\n";
      return 3;
    }
  }
  meshnet::protocol::PublicKey tracker_key{};
  if (!meshnet::protocol::ParsePublicKeyHex(flags["tracker_key"], &tracker_key)) {
    std::cerr << "worker: --tracker_key must be the tracker's Ed25519 public key as 64 hex "
                 "digits\n";
    return 2;
  }
  if (flags["node_id"].empty()) {
    std::cerr << "worker: --node_id is required (the id the tracker registered)\n";
    return 2;
  }
  const bool insecure = IntFlag(flags, "insecure", 0) != 0;
  std::string tls_cert, tls_key;
  if (!insecure && (!ReadFile(flags["tls_cert"], &tls_cert) ||
                    !ReadFile(flags["tls_key"], &tls_key))) {
    std::cerr << "worker: --tls_cert and --tls_key must name readable PEM files "
                 "(or pass --insecure=1 for plaintext on loopback)\n";
    return 2;
  }
  // Block the stop signals in every thread; main waits for them with sigwait.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  meshnet::worker::SchedulerOptions options;
  options.model.path = flags["model"];
  // --device: where the range's layers and KV live ("cpu", or "vulkan0" etc. in a binary linked
  // with that backend, //cpp/worker:worker_vulkan; ADR 0014).
  options.model.device = flags.count("device") ? flags["device"] : "cpu";
  if (flags.count("layers")) {
    const std::string& layers = flags["layers"];
    size_t colon = layers.find(':');
    if (colon == std::string::npos) {
      std::cerr << "worker: --layers wants A:B\n";
      return 2;
    }
    options.model.layer_start = std::atoi(layers.substr(0, colon).c_str());
    options.model.layer_end = std::atoi(layers.substr(colon + 1).c_str());
  }
  // What the tracker registered, which tickets name; the engine loads the same range unless the
  // test-only skip_layer cheat leaves one layer out (the first of a later range, else the last).
  const int registered_start = options.model.layer_start, registered_end = options.model.layer_end;
  if (flags.count("cheat") && flags["cheat"] == "skip_layer") {
    if (!flags.count("layers") || registered_end - registered_start < 2) {
      std::cerr << "worker: --cheat=skip_layer needs --layers=A:B with at least two layers\n";
      return 2;
    }
    if (registered_start > 0) {
      options.model.layer_start = registered_start + 1;
    } else {
      options.model.layer_end = registered_end - 1;
    }
  }
  const int max_sessions = IntFlag(flags, "max_sessions", 8);
  options.context.n_seq = max_sessions;
  options.context.n_ctx = IntFlag(flags, "n_ctx", 4096);
  options.context.n_threads = IntFlag(flags, "threads", 2);
  // Default: one KV stream per session, so a session's output does not depend on which other
  // sessions share its batches (bit-identical to running it alone). --unified_kv=1 shares one
  // stream (any session may use all of n_ctx); attention there stays flash attention's per-row
  // kernel over an F16 cache, the batch-invariant choice for a shared stream (UsesF32Attention).
  options.context.unified_kv = IntFlag(flags, "unified_kv", 0) != 0;
  // --reference_kernels=0: ggml's optimized CPU kernels, whose results depend on batch shape
  // (ADR 0009); benchmarks of what batch invariance costs only.
  options.context.reference_kernels = IntFlag(flags, "reference_kernels", 1) != 0;
  // --f32_attention=0: flash attention over an F16 KV cache, as upstream runs on CPU; its per-row
  // kernel sums V in F16, which costs agreement with fp32 math (ADR 0010); benchmarks only.
  options.context.f32_attention = IntFlag(flags, "f32_attention", 1) != 0;
  // --f32_matmul_activations=1: quantized weights are dequantized and dotted with F32 activations
  // instead of quantized ones (ADR 0012); the model's certified recipe says which.
  options.context.f32_matmul_activations = IntFlag(flags, "f32_matmul_activations", 0) != 0;
  options.max_batch_tokens = IntFlag(flags, "max_batch_tokens", 256);
  options.max_prefill_chunk = IntFlag(flags, "max_prefill_chunk", 128);
  options.max_queue = IntFlag(flags, "queue", 64);
  options.batch_window = std::chrono::microseconds(IntFlag(flags, "batch_window_us", 0));
  // On a GPU device, batches are shaped so that a row's numbers do not depend on its company
  // (BatchShape, ADR 0015); the CPU's reference kernels need no such limit.
  options.batch_shape = meshnet::worker::BatchShapeFor(options.model.device);
  std::string error;
  std::unique_ptr<meshnet::worker::Scheduler> scheduler =
      meshnet::worker::Scheduler::Start(options, &error);
  if (scheduler == nullptr) {
    std::cerr << "worker: " << error << "\n";
    return 1;
  }

  meshnet::worker::ServiceOptions service_options;
  service_options.node_id = flags["node_id"];
  service_options.tracker_key = tracker_key;
  service_options.layer_start = static_cast<uint32_t>(registered_start);
  service_options.layer_end =
      static_cast<uint32_t>(registered_end > 0 ? registered_end : scheduler->layer_end());
  service_options.compression = IntFlag(flags, "compression", 0) != 0;
  // The node's token for TakeWork comes through the environment, never argv (world-readable).
  if (const char* token = std::getenv("MESHNET_SUPERVISOR_TOKEN")) {
    service_options.supervisor_token = token;
    unsetenv("MESHNET_SUPERVISOR_TOKEN");
  }
  // The node's identity key signs commitments for audits (ADR 0008); like the token, never argv.
  if (const char* hex = std::getenv("MESHNET_NODE_KEY")) {
    meshnet::protocol::PublicKey seed{};  // 32 raw bytes, parsed like a key
    if (!meshnet::protocol::ParsePublicKeyHex(hex, &seed)) {
      std::cerr << "worker: $MESHNET_NODE_KEY must be 64 hex digits\n";
      return 2;
    }
    service_options.node_key.assign(reinterpret_cast<const char*>(seed.data()), seed.size());
    unsetenv("MESHNET_NODE_KEY");
  }
  // Test only: a cheating worker (issue 17), which audits must catch. skip_layer is the
  // engine's (one layer fewer loaded, above); the others act on the step's output (cheats.h).
  if (flags.count("cheat")) {
    const std::string cheat = flags["cheat"];
    if (cheat != "skip_layer") {
      std::string error;
      service_options.cheat = meshnet::worker::MakeCheat(cheat, &error);
      if (service_options.cheat == nullptr) {
        std::cerr << "worker: --cheat must be noise:FRACTION, garbage, forge_tokens or skip_layer ("
                  << error << ")\n";
        return 2;
      }
    }
    std::cerr << "worker: TEST ONLY: this worker cheats (" << cheat << ")\n";
  }
  service_options.record_commitments = IntFlag(flags, "commitments", 1) != 0;
  service_options.insecure = insecure;
  service_options.sessions.max_sessions = max_sessions;
  service_options.sessions.idle = std::chrono::seconds(IntFlag(flags, "idle_seconds", 300));
  service_options.ticket_deadline =
      std::chrono::milliseconds(IntFlag(flags, "ticket_deadline_ms", 10000));
  // Seam streams without a valid ticket yet (issue 55, finding 5): a quarter of the gRPC threads
  // in all, three quarters of that (at least 8, an honest burst of sessions from one gateway)
  // from one peer; a stream that sends nothing is cut after --first_frame_ms.
  const int max_threads = IntFlag(flags, "max_threads", 64);
  service_options.first_frame_deadline = std::chrono::milliseconds(IntFlag(flags, "first_frame_ms", 2000));
  service_options.max_stranger_streams = IntFlag(flags, "max_stranger_streams", std::max(2, max_threads / 4));
  service_options.max_stranger_streams_per_peer =
      IntFlag(flags, "max_stranger_streams_per_peer",
              std::max(std::min(8, service_options.max_stranger_streams), service_options.max_stranger_streams * 3 / 4));
  if (service_options.first_frame_deadline.count() <= 0 || service_options.max_stranger_streams < 1 ||
      service_options.max_stranger_streams_per_peer < 1) {
    std::cerr << "worker: --first_frame_ms, --max_stranger_streams and --max_stranger_streams_per_peer must be positive\n";
    return 2;
  }
  // A step without a budget_ms fails DEADLINE_EXCEEDED after this; connecting to the next hop
  // fails UNAVAILABLE after the other (or the step's deadline, if sooner).
  service_options.max_step = std::chrono::milliseconds(IntFlag(flags, "max_step_ms", 120000));
  service_options.connect_timeout =
      std::chrono::milliseconds(IntFlag(flags, "connect_timeout_ms", 10000));
  // A constrained draw that takes more CPU than this ends its session's sampling (0: no limit).
  service_options.sampling_budget =
      std::chrono::milliseconds(IntFlag(flags, "sampling_budget_ms", 1000));
  // A session whose constrained draw took more CPU than this draws at the lowest priority after.
  service_options.heavy_draw = std::chrono::milliseconds(IntFlag(flags, "heavy_draw_ms", 20));
  service_options.draw_threads = IntFlag(flags, "draw_threads", 4);
  if (service_options.sampling_budget.count() < 0 || service_options.heavy_draw.count() < 0 ||
      service_options.draw_threads < 0) {
    std::cerr << "worker: --sampling_budget_ms, --heavy_draw_ms and --draw_threads must be 0 or positive\n";
    return 2;
  }
  if (service_options.max_step.count() <= 0 || service_options.connect_timeout.count() <= 0) {
    std::cerr << "worker: --max_step_ms and --connect_timeout_ms must be positive\n";
    return 2;
  }
  auto service = std::make_unique<meshnet::worker::ShardService>(scheduler.get(), service_options);

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (insecure) {
    credentials = grpc::InsecureServerCredentials();
  } else {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({tls_key, tls_cert});
    credentials = grpc::SslServerCredentials(ssl);
  }
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.count("listen") ? flags["listen"] : "127.0.0.1:0", credentials,
                           &port);
  builder.SetMaxReceiveMessageSize(kMaxFrameBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             IntFlag(flags, "max_concurrent_streams", 32));
  const int keepalive_ms = IntFlag(flags, "keepalive_ms", 2000);
  if (keepalive_ms <= 0) {
    std::cerr << "worker: --keepalive_ms must be positive\n";
    return 2;
  }
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // A connection must finish its TLS handshake this soon (gRPC's default is 120 s): one byte
  // through a relay held a connection of the node's allocation for that long (issue 55, finding 11).
  const int handshake_ms = IntFlag(flags, "handshake_timeout_ms", 5000);
  if (handshake_ms <= 0) {
    std::cerr << "worker: --handshake_timeout_ms must be positive\n";
    return 2;
  }
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, handshake_ms);
  grpc::ResourceQuota quota("meshnet-worker");
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "worker: cannot listen on " << flags["listen"] << "\n";
    return 1;
  }
  std::printf("{\"event\":\"listening\",\"port\":%d}\n", port);
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop, &signal);
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  service.reset();
  scheduler->Stop();
  std::printf("{\"event\":\"stopped\",\"signal\":%d}\n", signal);
  return 0;
}
