#include "cpp/worker/downstream.h"

#include <grpcpp/grpcpp.h>

#include <utility>

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

Downstream::Downstream(const protocol::DownstreamHop& hop,
                       const DownstreamCredentials& credentials,
                       std::function<void(Status)> on_error)
    : hop_(hop), on_error_(std::move(on_error)), stream_(std::make_unique<Stream>()) {
  stream_->channel = Dial(hop.address, credentials);
  stream_->stub = pb::Shard::NewStub(stream_->channel);
  stream_->stream = stream_->stub->Seam(&stream_->context);
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
  if (finished_.get_future().wait_for(std::chrono::seconds(2)) != std::future_status::ready) {
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
