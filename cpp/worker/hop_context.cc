#include "cpp/worker/hop_context.h"

#include <utility>

namespace meshnet::worker {

protocol::SeamReply HopContext::Reply(const protocol::SeamFrame& frame, protocol::Status status,
                                      std::optional<uint64_t> cache) const {
  if (!status.ok() && status.hop.empty()) status.hop = options->node_id;
  protocol::SeamReply reply;
  reply.version = protocol::CurrentVersion();
  reply.session = frame.session;
  reply.step = frame.step;
  reply.credits = options->credits;
  if (cache.has_value()) reply.cache = protocol::CacheState{*cache};
  reply.status = std::move(status);
  return reply;
}

std::function<void(protocol::Status)> SessionLink::ReportUpstream() {
  return [this](protocol::Status status) {
    protocol::SeamReply reply;
    reply.version = protocol::CurrentVersion();
    reply.session = session;
    reply.step = last_step.load();
    reply.status = std::move(status);
    upstream->Write(reply);
  };
}

}  // namespace meshnet::worker
