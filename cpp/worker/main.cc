// The native shard worker: serves layers [layer_start, layer_end) of a dense llama GGUF over the
// seam protocol (meshnet.shard.v1.Shard). Started and supervised by the node.
//
// Usage: worker --model=PATH [--layers=A:B] [--listen=127.0.0.1:0] [--threads=N]
//   [--max_sessions=N] [--n_ctx=N] [--max_batch_tokens=N] [--max_prefill_chunk=N]
//   [--queue=N] [--idle_seconds=S] [--node_id=ID] [--unified_kv=0|1]
// Prints {"event":"listening","port":N} on stdout once serving; SIGTERM or SIGINT drains
// (in-flight RPCs get up to 5 s) and exits 0.
#include <grpcpp/grpcpp.h>
#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "cpp/worker/scheduler.h"
#include "cpp/worker/service.h"

namespace {

bool ParseFlags(int argc, char** argv, std::map<std::string, std::string>* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::cerr << "worker: expected --name=value, got " << arg << "\n";
      return false;
    }
    (*flags)[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  return true;
}

int Int(const std::map<std::string, std::string>& flags, const std::string& name, int fallback) {
  auto it = flags.find(name);
  return it == flags.end() ? fallback : std::atoi(it->second.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // glibc gives every thread its own malloc arena; the service starts reader threads per
  // downstream session, so uncapped arenas make RSS creep across thousands of sessions
  // (measured in soak_test.cc). Two arenas keep it flat at no measurable cost here.
  mallopt(M_ARENA_MAX, 2);
  std::map<std::string, std::string> flags;
  if (!ParseFlags(argc, argv, &flags) || !flags.count("model")) {
    std::cerr << "usage: worker --model=PATH [--layers=A:B] [--listen=HOST:PORT] ...\n";
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
  const int max_sessions = Int(flags, "max_sessions", 8);
  options.context.n_seq = max_sessions;
  options.context.n_ctx = Int(flags, "n_ctx", 4096);
  options.context.n_threads = Int(flags, "threads", 2);
  // Default: one KV stream per session, so a session's output does not depend on which other
  // sessions share its batches (bit-identical to running it alone). --unified_kv=1 shares one
  // stream (any session may use all of n_ctx).
  options.context.unified_kv = Int(flags, "unified_kv", 0) != 0;
  options.max_batch_tokens = Int(flags, "max_batch_tokens", 256);
  options.max_prefill_chunk = Int(flags, "max_prefill_chunk", 128);
  options.max_queue = Int(flags, "queue", 64);
  std::string error;
  std::unique_ptr<meshnet::worker::Scheduler> scheduler =
      meshnet::worker::Scheduler::Start(options, &error);
  if (scheduler == nullptr) {
    std::cerr << "worker: " << error << "\n";
    return 1;
  }

  meshnet::worker::ServiceOptions service_options;
  service_options.node_id = flags.count("node_id") ? flags["node_id"] : "worker";
  service_options.sessions.max_sessions = max_sessions;
  service_options.sessions.idle = std::chrono::seconds(Int(flags, "idle_seconds", 300));
  auto service = std::make_unique<meshnet::worker::ShardService>(scheduler.get(), service_options);

  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(flags.count("listen") ? flags["listen"] : "127.0.0.1:0",
                           grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
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
