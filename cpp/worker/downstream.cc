#include "cpp/worker/downstream.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "cpp/protocol/seam.h"
#include "cpp/worker/hop.h"
#include "meshnet/shard/v1/shard.grpc.pb.h"

namespace meshnet::worker {

namespace pb = meshnet::shard::v1;
using protocol::Code;
using protocol::MakeError;
using protocol::Status;

struct Downstream::Stream {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Shard::Stub> stub;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<pb::SeamFrame, pb::SeamReply>> stream;
};

namespace {

constexpr std::chrono::milliseconds kCloseGrace{250};  // see Close()

std::shared_ptr<grpc::Channel> Dial(const std::string& address,
                                    const DownstreamCredentials& credentials) {
  grpc::ChannelArguments args;
  if (credentials.insecure) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = credentials.pinned_cert_pem;
  args.SetSslTargetNameOverride(kNodeTlsName);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

}  // namespace

protocol::SeamFrame NextHopFrame(const protocol::SeamFrame& frame) {
  protocol::SeamFrame out = frame;
  out.token_ids.clear();
  out.range.reset();
  out.ticket.reset();
  out.downstream.clear();
  if (!frame.downstream.empty()) {
    out.ticket = frame.downstream[0].ticket;
    out.downstream.assign(frame.downstream.begin() + 1, frame.downstream.end());
  }
  return out;
}

Status Downstream::Open(const protocol::DownstreamHop& hop,
                        const DownstreamCredentials& credentials,
                        std::chrono::steady_clock::time_point connect_by,
                        const std::function<bool()>& abandoned,
                        std::function<void(Status)> on_error, std::unique_ptr<Downstream>* out) {
  auto stream = std::make_unique<Stream>();
  stream->channel = Dial(hop.address, credentials);
  const auto left = std::max(std::chrono::steady_clock::duration::zero(),
                             connect_by - std::chrono::steady_clock::now());
  // Connected, refused (a dead process, a closed port, a failed handshake: fail at once, so the
  // client fails over without waiting), or still connecting at the deadline (an unreachable host).
  const auto deadline = std::chrono::system_clock::now() + left;
  grpc_connectivity_state state = stream->channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY && state != GRPC_CHANNEL_TRANSIENT_FAILURE &&
         state != GRPC_CHANNEL_SHUTDOWN && std::chrono::system_clock::now() < deadline) {
    if (abandoned()) {
      return MakeError(Code::kCancelled, "upstream gone while connecting to " + hop.node_id, false);
    }
    const auto slice =
        std::min(deadline, std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    if (stream->channel->WaitForStateChange(state, slice)) {
      state = stream->channel->GetState(/*try_to_connect=*/true);
    }
  }
  if (state != GRPC_CHANNEL_READY) {
    const bool refused = state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN;
    Status status = MakeError(
        Code::kUnavailable,
        "next hop " + hop.node_id + " at " + hop.address +
            (refused ? std::string(" refused the connection")
                     : " not connected within " +
                           std::to_string(
                               std::chrono::duration_cast<std::chrono::milliseconds>(left).count()) +
                           " ms"),
        true);
    status.hop = hop.node_id;
    return status;
  }
  stream->stub = pb::Shard::NewStub(stream->channel);
  stream->stream = stream->stub->Seam(&stream->context);
  out->reset(new Downstream(hop, std::move(on_error), std::move(stream)));
  return protocol::OkStatus();
}

Downstream::Downstream(const protocol::DownstreamHop& hop, std::function<void(Status)> on_error,
                       std::unique_ptr<Stream> stream)
    : hop_(hop), on_error_(std::move(on_error)), stream_(std::move(stream)) {
  reader_ = std::thread([this] { Read(); });
}

Downstream::~Downstream() { Close(); }

bool Downstream::Send(const protocol::SeamFrame& frame) {
  pb::SeamFrame message;
  protocol::ToProto(frame, &message);
  std::lock_guard<std::mutex> lock(write_mu_);
  return !closed_ && stream_->stream->Write(message);
}

void Downstream::Close() {
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    if (closed_) return;
    closed_ = true;
    stream_->stream->WritesDone();
  }
  // A next hop that is alive finishes at once; one that is cut off or stopped never does, and
  // the session (and the lock the caller holds) must not wait for it: after a short grace the
  // stream is cancelled, which frees the session on the next hop just as a finish would.
  if (finished_.get_future().wait_for(kCloseGrace) != std::future_status::ready) {
    stream_->context.TryCancel();
  }
  reader_.join();
}

void Downstream::Read() {
  pb::SeamReply message;
  while (stream_->stream->Read(&message)) {
    protocol::SeamReply reply;
    protocol::FromProto(message, &reply);
    if (reply.status.has_value() && !reply.status->ok()) {
      Status status = *reply.status;
      if (status.hop.empty()) status.hop = hop_.node_id;
      on_error_(status);
    }
  }
  grpc::Status status = stream_->stream->Finish();
  bool closed;
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    closed = closed_;
  }
  if (!closed) {  // the next hop is gone: name it, so the client reports the right node
    Status lost = MakeError(Code::kUnavailable,
                            "next hop " + hop_.node_id + " lost: " + status.error_message(), true);
    lost.hop = hop_.node_id;
    on_error_(lost);
  }
  finished_.set_value();
}

}  // namespace meshnet::worker
