// The floor under a hop's transport (issue 31): a bare meshnet.shard.v1.Shard/Seam server that
// answers each frame at once, and a client that sends a frame of a decode step's size and waits
// for the answer, over loopback. What it measures is gRPC's own cost for the worker's message
// shapes, with no admission, engine or encoding around it: if a hop's measured overhead is
// close to this, gRPC is the floor.
//
// Usage: seam_echo [--bytes=2304] [--frames=2000] [--warmup=200] [--tls=0|1]
//                  [--server=sync|callback] [--client=sequential|concurrent|callback]
//                  [--out=FILE.json]
// --bytes is the fragment's payload (2304: one 576-wide f32 row, SmolLM2's decode step).
// --server=sync is the worker's server today (a thread per call, blocking Read/Write);
// callback is gRPC's callback API (a reactor, no thread per call). Each frame is a SeamFrame
// with a session, span, step and fragment, answered by a SeamReply with a status and cache, as
// a hop answers. --client=sequential writes a frame and reads its answer on one thread;
// concurrent reads answers on a second thread, as the worker's Downstream does, and writes the
// next frame once the answer is in; callback uses gRPC's callback client (StartWrite returns at
// once, answers arrive in OnReadDone). Prints one JSON object: round trip, the Write call alone,
// and one way (the frame's Write to the server's Read returning), in microseconds (p50, p90,
// p99, mean).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpp/protocol/ticket.h"
#include "cpp/protocol/ticket_signer_for_tests.h"
#include "cpp/worker/flags.h"
#include "cpp/worker/hop.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace {

namespace pb = meshnet::shard::v1;
using Clock = std::chrono::steady_clock;

// When the server's Read returned each frame (by step), for the one-way figure.
std::mutex received_mu;
std::map<uint64_t, Clock::time_point> received_at;

pb::SeamReply Answer(const pb::SeamFrame& frame) {
  {
    std::lock_guard<std::mutex> lock(received_mu);
    received_at[frame.step()] = Clock::now();
  }
  pb::SeamReply reply;
  *reply.mutable_session() = frame.session();
  reply.set_step(frame.step());
  reply.set_credits(8);
  reply.mutable_cache()->set_length(frame.span().start() + frame.span().count());
  reply.mutable_status()->set_code(pb::STATUS_CODE_OK);
  return reply;
}

// The worker's shape today: one gRPC thread per Seam call, blocking Read and Write.
class SyncEcho final : public pb::Shard::Service {
 public:
  grpc::Status Seam(grpc::ServerContext*,
                    grpc::ServerReaderWriter<pb::SeamReply, pb::SeamFrame>* stream) override {
    pb::SeamFrame frame;
    while (stream->Read(&frame)) {
      if (!stream->Write(Answer(frame))) break;
    }
    return grpc::Status::OK;
  }
};

// gRPC's callback API: a reactor per call, reads and writes completed on gRPC's threads.
class CallbackEcho final : public pb::Shard::CallbackService {
 public:
  grpc::ServerBidiReactor<pb::SeamFrame, pb::SeamReply>* Seam(
      grpc::CallbackServerContext*) override {
    class Reactor final : public grpc::ServerBidiReactor<pb::SeamFrame, pb::SeamReply> {
     public:
      Reactor() { StartRead(&frame_); }
      void OnReadDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        reply_ = Answer(frame_);
        StartWrite(&reply_);
      }
      void OnWriteDone(bool ok) override {
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        StartRead(&frame_);
      }
      void OnDone() override { delete this; }

     private:
      pb::SeamFrame frame_;
      pb::SeamReply reply_;
    };
    return new Reactor();
  }
};

double Percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t i = std::min(values.size() - 1, static_cast<size_t>(q * (values.size() - 1) + 0.5));
  return values[i];
}

std::string Summary(const std::vector<double>& us) {
  double sum = 0;
  for (double v : us) sum += v;
  return "{\"p50\": " + std::to_string(Percentile(us, 0.5)) +
         ", \"p90\": " + std::to_string(Percentile(us, 0.9)) +
         ", \"p99\": " + std::to_string(Percentile(us, 0.99)) +
         ", \"mean\": " + std::to_string(sum / us.size()) + "}";
}

double Micros(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// Answers read by a second thread (the worker's Downstream shape): the writer waits for each.
class AnswerReader {
 public:
  explicit AnswerReader(grpc::ClientReaderWriter<pb::SeamFrame, pb::SeamReply>* stream)
      : thread_([this, stream] {
          pb::SeamReply reply;
          while (stream->Read(&reply)) {
            std::lock_guard<std::mutex> lock(mu_);
            last_ = reply.step();
            at_ = Clock::now();
            ready_.notify_all();
          }
        }) {}
  ~AnswerReader() { thread_.join(); }
  // Waits for the answer to `step`; when it was read.
  Clock::time_point Await(uint64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return last_ >= step; });
    return at_;
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  uint64_t last_ = 0;
  Clock::time_point at_;
  std::thread thread_;
};

// gRPC's callback client: frames written with StartWrite from the caller's thread (a hold keeps
// the call open for that), answers read in OnReadDone.
class CallbackClient final : public grpc::ClientBidiReactor<pb::SeamFrame, pb::SeamReply> {
 public:
  explicit CallbackClient(pb::Shard::Stub* stub) {
    stub->async()->Seam(&context_, this);
    StartRead(&reply_);
    AddHold();
    StartCall();
  }
  void Write(const pb::SeamFrame* frame) { StartWrite(frame); }
  // Waits for the write to complete and the answer to `step`; when the answer was read.
  Clock::time_point Await(uint64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return (last_ >= step && written_) || done_; });
    written_ = false;
    return at_;
  }
  bool Finish() {
    StartWritesDone();
    RemoveHold();
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return done_; });
    return status_.ok();
  }
  void OnWriteDone(bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    written_ = true;
    ready_.notify_all();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_ = reply_.step();
      at_ = Clock::now();
      ready_.notify_all();
    }
    StartRead(&reply_);
  }
  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    ready_.notify_all();
  }

 private:
  grpc::ClientContext context_;
  pb::SeamReply reply_;
  std::mutex mu_;
  std::condition_variable ready_;
  uint64_t last_ = 0;
  bool written_ = false, done_ = false;
  Clock::time_point at_;
  grpc::Status status_;
};

}  // namespace

int main(int argc, char** argv) {
  using meshnet::worker::IntFlag;
  using meshnet::worker::StringFlag;
  meshnet::worker::Flags flags;
  if (!meshnet::worker::ParseFlags(argc, argv, "seam_echo", &flags)) return 2;
  auto number = [&](const std::string& name, int fallback) { return IntFlag(flags, name, fallback); };
  const int bytes = number("bytes", 2304), frames = number("frames", 2000);
  const int warmup = number("warmup", 200);
  const bool tls = number("tls", 0) != 0;
  const std::string server_kind = StringFlag(flags, "server", "sync");
  if (bytes < 0 || frames < 1 || warmup < 0 || (server_kind != "sync" && server_kind != "callback")) {
    std::cerr << "seam_echo: --bytes >= 0, --frames >= 1, --warmup >= 0, --server=sync|callback\n";
    return 2;
  }

  std::shared_ptr<grpc::ServerCredentials> server_credentials = grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials = grpc::InsecureChannelCredentials();
  grpc::ChannelArguments args;
  if (tls) {
    const meshnet::protocol::TlsIdentity identity = meshnet::protocol::MakeSelfSignedTls();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({identity.private_key_pem, identity.certificate_pem});
    server_credentials = grpc::SslServerCredentials(ssl);
    grpc::SslCredentialsOptions client_ssl;
    client_ssl.pem_root_certs = identity.certificate_pem;
    channel_credentials = grpc::SslCredentials(client_ssl);
    args.SetSslTargetNameOverride(meshnet::worker::kNodeTlsName);
  }
  SyncEcho sync_service;
  CallbackEcho callback_service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", server_credentials, &port);
  if (server_kind == "sync") {
    builder.RegisterService(&sync_service);
  } else {
    builder.RegisterService(&callback_service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "seam_echo: the server did not start\n";
    return 1;
  }

  auto stub = pb::Shard::NewStub(
      grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port), channel_credentials, args));
  const std::string client_kind = StringFlag(flags, "client", "sequential");
  if (client_kind != "sequential" && client_kind != "concurrent" && client_kind != "callback") {
    std::cerr << "seam_echo: --client=sequential|concurrent|callback\n";
    return 2;
  }
  std::unique_ptr<CallbackClient> callback;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SeamFrame, pb::SeamReply>> stream;
  if (client_kind == "callback") {
    callback = std::make_unique<CallbackClient>(stub.get());
  } else {
    stream = stub->Seam(&context);
  }
  pb::SeamFrame frame;
  frame.mutable_session()->set_session_id("echo-session-0123456789abcdef");
  frame.mutable_session()->set_epoch(1);
  frame.set_phase(pb::PHASE_DECODE);
  frame.mutable_span()->set_count(1);
  frame.mutable_fragment()->set_count(1);
  frame.mutable_fragment()->set_data(std::string(static_cast<size_t>(bytes), '\x5a'));
  const bool concurrent = client_kind == "concurrent";
  std::unique_ptr<AnswerReader> reader;
  if (concurrent) reader = std::make_unique<AnswerReader>(stream.get());
  std::vector<double> rtt_us, write_us, one_way_us;
  pb::SeamReply reply;
  for (int i = 0; i < warmup + frames; ++i) {
    const uint64_t step = static_cast<uint64_t>(i + 1);
    frame.set_step(step);
    frame.mutable_span()->set_start(static_cast<uint64_t>(128 + i));
    const Clock::time_point sent = Clock::now();
    bool written = true;
    if (callback != nullptr) {
      callback->Write(&frame);
    } else {
      written = stream->Write(frame);
    }
    const Clock::time_point wrote = Clock::now();
    Clock::time_point answered;
    if (callback != nullptr) {
      answered = callback->Await(step);
    } else if (concurrent) {
      answered = written ? reader->Await(step) : wrote;
    } else {
      if (written && (!stream->Read(&reply) || reply.step() != step)) written = false;
      answered = Clock::now();
    }
    if (!written) {
      std::cerr << "seam_echo: the stream broke at frame " << i << "\n";
      return 1;
    }
    if (i < warmup) continue;
    rtt_us.push_back(Micros(sent, answered));
    write_us.push_back(Micros(sent, wrote));
    std::lock_guard<std::mutex> lock(received_mu);
    one_way_us.push_back(Micros(sent, received_at[step]));
  }
  grpc::Status finished;
  if (callback != nullptr) {
    if (!callback->Finish()) finished = grpc::Status(grpc::StatusCode::UNKNOWN, "callback call failed");
  } else {
    stream->WritesDone();
    finished = stream->Finish();
  }
  reader.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (!finished.ok()) {
    std::cerr << "seam_echo: the stream ended with " << finished.error_message() << "\n";
    return 1;
  }
  std::string json = "{\"server\": \"" + server_kind + "\", \"client\": \"" +
                     client_kind + "\", \"tls\": " +
                     (tls ? "true" : "false") + ", \"payload_bytes\": " + std::to_string(bytes) +
                     ", \"frame_bytes\": " + std::to_string(frame.ByteSizeLong()) +
                     ", \"frames\": " + std::to_string(frames) + ", \"rtt_us\": " + Summary(rtt_us) +
                     ", \"write_us\": " + Summary(write_us) + ", \"one_way_us\": " +
                     Summary(one_way_us) + "}";
  std::cout << json << std::endl;
  if (flags.count("out")) std::ofstream(flags["out"]) << json << "\n";
  return 0;
}
