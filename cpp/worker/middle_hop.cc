#include "cpp/worker/middle_hop.h"

#include <algorithm>
#include <string>
#include <utility>

#include "cpp/wire/tensor.h"
#include "cpp/worker/hop.h"

namespace meshnet::worker {
namespace {

constexpr char kHidden[] = "hidden_states";

}  // namespace

protocol::Status Receiving::Rows(const HopContext& hop, const protocol::SeamFrame& frame,
                                 std::vector<float>* hidden, bool* complete) {
  if (!frame.fragment.has_value()) return protocol::InvalidArgumentError("hidden states expected");
  const uint32_t count = frame.span->count;
  const int n_embd = hop.scheduler->n_embd();
  const bool compression = hop.options->compression;
  protocol::Status accepted = CheckFragment(*frame.fragment, compression);
  if (!accepted.ok()) {
    reassembler_.Reset();
    return accepted;
  }
  // Bound this step's bundle by what it may carry, before fragment 0 allocates anything.
  if (frame.fragment->index == 0) reassembler_.set_limits(StepLimits(count, n_embd, compression));
  protocol::Status added = reassembler_.Add(*frame.fragment);
  if (!added.ok()) return added;
  *complete = reassembler_.complete();
  if (!*complete) return protocol::OkStatus();
  std::vector<protocol::Tensor> tensors;
  protocol::Status taken = reassembler_.Take(&tensors);
  if (!taken.ok()) return taken;
  auto it = std::find_if(tensors.begin(), tensors.end(),
                         [](const protocol::Tensor& t) { return t.name == kHidden; });
  std::vector<uint64_t> shape = {count, static_cast<uint64_t>(n_embd)};
  if (it == tensors.end() || it->shape != shape) {
    return protocol::InvalidArgumentError(std::string("bundle lacks ") + kHidden + " of shape [" +
                                          std::to_string(count) + ", " + std::to_string(n_embd) +
                                          "]");
  }
  *hidden = protocol::TensorToFloats(*it);
  if (hidden->size() != uint64_t{count} * n_embd) {
    return protocol::InvalidArgumentError("unsupported dtype for " + std::string(kHidden));
  }
  return CheckFinite(*hidden, n_embd);
}

protocol::Status Forwarding::Send(const HopContext& hop, SessionLink& link,
                                  const protocol::SeamFrame& frame, const std::vector<float>& rows,
                                  const StepDeadline& deadline) {
  const ServiceOptions& options = *hop.options;
  if (downstream_ == nullptr) {
    // Only the hop the ticket names, and only over TLS that trusts the ticket's certificate.
    if (!next_.has_value()) {
      return protocol::InvalidArgumentError("not the last hop, but no downstream hop given");
    }
    std::shared_ptr<SeamCall> upstream = link.upstream;
    protocol::Status opened = Downstream::Open(
        *next_,
        DownstreamCredentials{options.insecure, link.ticket.downstream_tls_certificate},
        std::min(deadline.deadline(), Clock::now() + options.connect_timeout),
        [upstream] { return upstream->Abandoned(); }, link.ReportUpstream(), &downstream_);
    if (!opened.ok()) {
      return deadline.Spent(Clock::now()) ? deadline.Exceeded(frame.step, options.node_id) : opened;
    }
  }
  const Clock::time_point now = Clock::now();
  if (deadline.Spent(now)) return deadline.Exceeded(frame.step, options.node_id);
  std::vector<protocol::Tensor> tensors = {protocol::TensorFromFloats(
      kHidden, protocol::DType::kF32,
      {frame.span->count, static_cast<uint64_t>(hop.scheduler->n_embd())}, rows.data())};
  protocol::Limits limits;
  std::vector<protocol::TensorFragment> fragments;
  protocol::Status encoded = protocol::EncodeBundle(
      tensors, frame.step, protocol::Compression::kNone, limits.max_fragment_bytes, limits, &fragments);
  if (!encoded.ok()) return encoded;
  protocol::SeamFrame next = NextHopFrame(frame);
  next.budget_ms = deadline.Remaining(now);
  for (protocol::TensorFragment& fragment : fragments) {
    next.fragment = std::move(fragment);
    if (!downstream_->Send(next)) {
      protocol::Status lost = protocol::MakeError(
          protocol::Code::kUnavailable, "next hop " + downstream_->hop().node_id + " lost", true);
      lost.hop = downstream_->hop().node_id;
      return lost;
    }
    next.ticket.reset();  // the first fragment carried it
  }
  return protocol::OkStatus();
}

void Forwarding::Close(const protocol::SeamFrame* forward) {
  if (downstream_ == nullptr) return;
  if (forward != nullptr) downstream_->Send(NextHopFrame(*forward));
  downstream_.reset();  // half-closes and joins its reader
}

}  // namespace meshnet::worker
