#include "cpp/protocol/bundle.h"

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {
namespace pb = ::meshnet::shard::v1;
namespace {

constexpr uint64_t kMaxZlibChunk = UINT_MAX;  // zlib counts bytes in uInt

uint32_t Crc32(const uint8_t* data, uint64_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const uInt chunk = static_cast<uInt>(std::min<uint64_t>(size, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::string Hex32(uint32_t value) {
  char buffer[11];
  std::snprintf(buffer, sizeof(buffer), "0x%08x", value);
  return buffer;
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF), as protobuf requires
// of proto3 strings.
bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t extra;
    uint32_t code_point;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1;
      code_point = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      code_point = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      code_point = c & 0x07;
    } else {
      return false;
    }
    if (text.size() - i <= extra) return false;
    for (size_t k = 1; k <= extra; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3f);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0x80, 0x800, 0x10000};
    if (code_point < kMinForLength[extra] || code_point > 0x10ffff ||
        (code_point >= 0xd800 && code_point <= 0xdfff)) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

// Checks one tensor's description against ADR 0002 and `limits`, in the order both codecs
// use (name, dtype, byte order, rank, dims, size); on success *length = product(shape) *
// itemsize. A tensor larger than max_bundle_bytes is RESOURCE_EXHAUSTED, the rest
// INVALID_ARGUMENT.
Status CheckTensor(size_t index, const std::string& name, DType dtype, ByteOrder byte_order,
                   const std::vector<uint64_t>& shape, const Limits& limits, uint64_t* length) {
  const std::string what = "tensor " + std::to_string(index) + " '" + name + "'";
  if (name.empty() || name.size() > limits.max_name_bytes) {
    return InvalidArgumentError(what + ": name must be 1.." +
                                std::to_string(limits.max_name_bytes) + " bytes, got " +
                                std::to_string(name.size()));
  }
  if (!IsValidUtf8(name)) return InvalidArgumentError(what + ": name is not valid UTF-8");
  const uint64_t item = ItemSize(dtype);
  if (item == 0) return InvalidArgumentError(what + ": unknown " + DTypeName(dtype));
  if (byte_order != ByteOrder::kLittle && byte_order != ByteOrder::kBig) {
    return InvalidArgumentError(what + ": unknown byte order " +
                                std::to_string(static_cast<int32_t>(byte_order)));
  }
  if (shape.empty() || shape.size() > limits.max_rank) {
    return InvalidArgumentError(what + ": rank " + std::to_string(shape.size()) +
                                " is outside 1.." + std::to_string(limits.max_rank));
  }
  for (uint64_t dim : shape) {
    if (dim == 0) return InvalidArgumentError(what + ": zero dim in " + ShapeString(shape));
  }
  uint64_t product = item;
  for (uint64_t dim : shape) {
    if (dim > limits.max_bundle_bytes / product) {  // product * dim > max_bundle_bytes
      return ResourceExhaustedError(what + ": " + DTypeName(dtype) + ShapeString(shape) +
                                    " exceeds max_bundle_bytes " +
                                    std::to_string(limits.max_bundle_bytes));
    }
    product *= dim;
  }
  *length = product;
  return OkStatus();
}

// Appends bytes [pos, pos + size) of the concatenation of the tensors' bytes to *out.
void AppendPayloadRange(const std::vector<Tensor>& tensors, uint64_t pos, uint64_t size,
                        std::string* out) {
  for (const Tensor& tensor : tensors) {
    if (size == 0) return;
    const uint64_t length = tensor.bytes.size();
    if (pos >= length) {
      pos -= length;
      continue;
    }
    const uint64_t take = std::min(size, length - pos);
    out->append(reinterpret_cast<const char*>(tensor.bytes.data()) + pos, take);
    size -= take;
    pos = 0;
  }
}

Status Compress(const std::vector<Tensor>& tensors, uint64_t payload_bytes, std::string* wire) {
  std::string payload;
  payload.reserve(payload_bytes);
  AppendPayloadRange(tensors, 0, payload_bytes, &payload);
  uLongf wire_size = compressBound(payload.size());
  wire->resize(wire_size);
  const int ret = compress2(reinterpret_cast<Bytef*>(wire->data()), &wire_size,
                            reinterpret_cast<const Bytef*>(payload.data()), payload.size(), 1);
  if (ret != Z_OK) return InternalError("zlib compress2 failed with code " + std::to_string(ret));
  wire->resize(wire_size);
  return OkStatus();
}

// Inflates `wire` into exactly `payload_bytes` bytes; never writes past them.
Status Decompress(const uint8_t* wire, uint64_t wire_bytes, uint64_t payload_bytes,
                  std::string* payload) {
  payload->assign(payload_bytes, '\0');
  z_stream stream{};
  if (inflateInit(&stream) != Z_OK) return InternalError("zlib inflateInit failed");
  uint64_t in_pos = 0;
  uint64_t out_pos = 0;
  unsigned char overflow_byte;
  Status status;
  while (true) {
    const bool probing = out_pos == payload_bytes;  // any further output is too much
    stream.next_in = const_cast<Bytef*>(wire) + in_pos;
    stream.avail_in = static_cast<uInt>(std::min<uint64_t>(wire_bytes - in_pos, kMaxZlibChunk));
    if (probing) {
      stream.next_out = &overflow_byte;
      stream.avail_out = 1;
    } else {
      stream.next_out = reinterpret_cast<Bytef*>(payload->data()) + out_pos;
      stream.avail_out =
          static_cast<uInt>(std::min<uint64_t>(payload_bytes - out_pos, kMaxZlibChunk));
    }
    const uInt in_before = stream.avail_in;
    const uInt out_before = stream.avail_out;
    const int ret = inflate(&stream, Z_NO_FLUSH);
    const uint64_t consumed = in_before - stream.avail_in;
    const uint64_t produced = out_before - stream.avail_out;
    in_pos += consumed;
    if (probing && produced > 0) {
      status = InvalidArgumentError("zlib payload decompresses to more than payload_bytes (" +
                                    std::to_string(payload_bytes) + ")");
      break;
    }
    out_pos += produced;
    if (ret == Z_STREAM_END) break;
    if (ret != Z_OK && ret != Z_BUF_ERROR) {
      status = InvalidArgumentError(std::string("zlib payload is corrupt: ") +
                                    (stream.msg != nullptr ? stream.msg : "inflate failed"));
      break;
    }
    if (consumed == 0 && produced == 0) {
      status = InvalidArgumentError("zlib payload is truncated after " + std::to_string(out_pos) +
                                    " of " + std::to_string(payload_bytes) + " bytes");
      break;
    }
  }
  inflateEnd(&stream);
  if (!status.ok()) return status;
  if (out_pos != payload_bytes) {
    return InvalidArgumentError("zlib payload decompresses to " + std::to_string(out_pos) +
                                " bytes, header says payload_bytes " +
                                std::to_string(payload_bytes));
  }
  if (in_pos != wire_bytes) {
    return InvalidArgumentError(std::to_string(wire_bytes - in_pos) +
                                " bytes follow the end of the zlib stream");
  }
  return OkStatus();
}

void SwapToLittle(size_t item, std::vector<uint8_t>* bytes) {
  for (size_t i = 0; i + item <= bytes->size(); i += item) {
    std::reverse(bytes->begin() + i, bytes->begin() + i + item);
  }
}

}  // namespace

uint32_t Limits::max_fragments() const {
  if (max_fragment_bytes == 0) return 0;
  const uint64_t count = max_bundle_bytes / max_fragment_bytes +
                         (max_bundle_bytes % max_fragment_bytes != 0 ? 1 : 0);
  return static_cast<uint32_t>(std::min<uint64_t>(count, UINT32_MAX));
}

// ---- proto conversions ------------------------------------------------------------------

void ToProto(const TensorSpec& in, pb::TensorSpec* out) {
  out->Clear();
  out->set_name(in.name);
  out->set_dtype(static_cast<pb::DType>(in.dtype));
  for (uint64_t dim : in.shape) out->add_shape(dim);
  out->set_byte_order(static_cast<pb::ByteOrder>(in.byte_order));
  out->set_offset(in.offset);
  out->set_length(in.length);
  out->set_crc32(in.crc32);
}

void ToProto(const BundleHeader& in, pb::BundleHeader* out) {
  out->Clear();
  for (const TensorSpec& spec : in.tensors) ToProto(spec, out->add_tensors());
  out->set_compression(static_cast<pb::Compression>(in.compression));
  out->set_payload_bytes(in.payload_bytes);
  out->set_wire_bytes(in.wire_bytes);
}

void ToProto(const TensorFragment& in, pb::TensorFragment* out) {
  out->Clear();
  out->set_bundle_id(in.bundle_id);
  out->set_index(in.index);
  out->set_count(in.count);
  if (in.header.has_value()) ToProto(*in.header, out->mutable_header());
  out->set_data(in.data);
}

void FromProto(const pb::TensorSpec& in, TensorSpec* out) {
  out->name = in.name();
  out->dtype = static_cast<DType>(in.dtype());
  out->shape.assign(in.shape().begin(), in.shape().end());
  out->byte_order = static_cast<ByteOrder>(in.byte_order());
  out->offset = in.offset();
  out->length = in.length();
  out->crc32 = in.crc32();
}

void FromProto(const pb::BundleHeader& in, BundleHeader* out) {
  out->tensors.resize(in.tensors_size());
  for (int i = 0; i < in.tensors_size(); ++i) FromProto(in.tensors(i), &out->tensors[i]);
  out->compression = static_cast<Compression>(in.compression());
  out->payload_bytes = in.payload_bytes();
  out->wire_bytes = in.wire_bytes();
}

void FromProto(const pb::TensorFragment& in, TensorFragment* out) {
  out->bundle_id = in.bundle_id();
  out->index = in.index();
  out->count = in.count();
  out->header.reset();
  if (in.has_header()) FromProto(in.header(), &out->header.emplace());
  out->data = in.data();
}

// ---- encoding ---------------------------------------------------------------------------

Status EncodeBundle(const std::vector<Tensor>& tensors, uint64_t bundle_id,
                    Compression compression, uint64_t fragment_bytes, const Limits& limits,
                    std::vector<TensorFragment>* out) {
  out->clear();
  if (tensors.empty()) return InvalidArgumentError("a bundle needs at least one tensor");
  if (tensors.size() > limits.max_tensors) {
    return ResourceExhaustedError("bundle has " + std::to_string(tensors.size()) +
                                  " tensors, the limit is " + std::to_string(limits.max_tensors));
  }
  if (compression != Compression::kNone && compression != Compression::kZlib) {
    return InvalidArgumentError("unknown compression " +
                                std::to_string(static_cast<int32_t>(compression)));
  }
  if (fragment_bytes == 0) return InvalidArgumentError("fragment_bytes must be >= 1");
  if (fragment_bytes > limits.max_fragment_bytes) {
    return ResourceExhaustedError("fragment_bytes " + std::to_string(fragment_bytes) +
                                  " exceeds max_fragment_bytes " +
                                  std::to_string(limits.max_fragment_bytes));
  }

  BundleHeader header;
  header.compression = compression;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    uint64_t length = 0;
    Status status = CheckTensor(i, tensor.name, tensor.dtype, ByteOrder::kLittle, tensor.shape,
                                limits, &length);
    if (!status.ok()) return status;
    if (tensor.bytes.size() != length) {
      return InvalidArgumentError("tensor " + std::to_string(i) + " '" + tensor.name + "' has " +
                                  std::to_string(tensor.bytes.size()) + " bytes; " +
                                  DTypeName(tensor.dtype) + ShapeString(tensor.shape) +
                                  " needs " + std::to_string(length));
    }
    if (length > limits.max_bundle_bytes - offset) {
      return ResourceExhaustedError("bundle payload exceeds max_bundle_bytes " +
                                    std::to_string(limits.max_bundle_bytes));
    }
    TensorSpec& spec = header.tensors.emplace_back();
    spec.name = tensor.name;
    spec.dtype = tensor.dtype;
    spec.shape = tensor.shape;
    spec.byte_order = ByteOrder::kLittle;
    spec.offset = offset;
    spec.length = length;
    spec.crc32 = Crc32(tensor.bytes.data(), length);
    offset += length;
  }
  header.payload_bytes = offset;

  std::string compressed;
  if (compression == Compression::kZlib) {
    Status status = Compress(tensors, header.payload_bytes, &compressed);
    if (!status.ok()) return status;
    header.wire_bytes = compressed.size();
  } else {
    header.wire_bytes = header.payload_bytes;
  }
  if (header.wire_bytes > limits.max_bundle_bytes) {
    return ResourceExhaustedError("bundle wire payload of " + std::to_string(header.wire_bytes) +
                                  " bytes exceeds max_bundle_bytes " +
                                  std::to_string(limits.max_bundle_bytes));
  }
  const uint64_t count = (header.wire_bytes + fragment_bytes - 1) / fragment_bytes;
  if (count > limits.max_fragments()) {
    return ResourceExhaustedError("bundle needs " + std::to_string(count) + " fragments of " +
                                  std::to_string(fragment_bytes) + " bytes, the limit is " +
                                  std::to_string(limits.max_fragments()));
  }

  std::vector<TensorFragment> fragments(count);
  for (uint64_t i = 0; i < count; ++i) {
    TensorFragment& fragment = fragments[i];
    fragment.bundle_id = bundle_id;
    fragment.index = static_cast<uint32_t>(i);
    fragment.count = static_cast<uint32_t>(count);
    const uint64_t pos = i * fragment_bytes;
    const uint64_t size = std::min(fragment_bytes, header.wire_bytes - pos);
    if (compression == Compression::kZlib) {
      fragment.data.assign(compressed, pos, size);
    } else {
      fragment.data.reserve(size);
      AppendPayloadRange(tensors, pos, size, &fragment.data);
    }
  }
  fragments[0].header = std::move(header);
  *out = std::move(fragments);
  return OkStatus();
}

Status EncodeBundle(const std::vector<Tensor>& tensors, uint64_t bundle_id,
                    Compression compression, uint64_t fragment_bytes, const Limits& limits,
                    std::vector<pb::TensorFragment>* out) {
  out->clear();
  std::vector<TensorFragment> fragments;
  Status status = EncodeBundle(tensors, bundle_id, compression, fragment_bytes, limits, &fragments);
  if (!status.ok()) return status;
  out->resize(fragments.size());
  for (size_t i = 0; i < fragments.size(); ++i) {
    TensorFragment& fragment = fragments[i];
    pb::TensorFragment& proto = (*out)[i];
    proto.set_bundle_id(fragment.bundle_id);
    proto.set_index(fragment.index);
    proto.set_count(fragment.count);
    if (fragment.header.has_value()) ToProto(*fragment.header, proto.mutable_header());
    proto.set_data(std::move(fragment.data));
  }
  return OkStatus();
}

// ---- reassembly -------------------------------------------------------------------------

Reassembler::Reassembler(Limits limits) : limits_(limits) {}

bool Reassembler::complete() const { return active_ && received_ == count_; }

void Reassembler::Reset() {
  active_ = false;
  bundle_id_ = 0;
  count_ = 0;
  received_ = 0;
  seen_.clear();
  slice_bytes_ = 0;
  header_ = BundleHeader();
  wire_.reset();
}

Status Reassembler::Add(const TensorFragment& fragment) {
  Status status = AddSlice(fragment.bundle_id, fragment.index, fragment.count,
                           fragment.header.has_value() ? &*fragment.header : nullptr,
                           fragment.data);
  if (!status.ok()) Reset();
  return status;
}

Status Reassembler::Add(const pb::TensorFragment& fragment) {
  std::optional<BundleHeader> header;
  if (fragment.has_header()) FromProto(fragment.header(), &header.emplace());
  Status status = AddSlice(fragment.bundle_id(), fragment.index(), fragment.count(),
                           header.has_value() ? &*header : nullptr, fragment.data());
  if (!status.ok()) Reset();
  return status;
}

Status Reassembler::AddSlice(uint64_t bundle_id, uint32_t index, uint32_t count,
                             const BundleHeader* header, std::string_view data) {
  const std::string where = "fragment " + std::to_string(index) + "/" + std::to_string(count) +
                            " of bundle " + std::to_string(bundle_id);
  if (active_ && bundle_id != bundle_id_) {
    const std::string held = "bundle " + std::to_string(bundle_id_) + " has " +
                             std::to_string(received_) + " of " + std::to_string(count_) +
                             " fragments";
    if (complete()) return InvalidArgumentError(where + " arrived, " + held + " not taken");
    return InvalidArgumentError("missing fragments: " + held + " when " + where + " arrived");
  }
  if (!active_) {
    if (index != 0) {
      return InvalidArgumentError("missing fragments: " + where +
                                  " arrived before fragment 0" +
                                  (header != nullptr ? " (and carries a header)" : ""));
    }
    if (header == nullptr) return InvalidArgumentError(where + ": fragment 0 has no header");
    if (count == 0) return InvalidArgumentError(where + ": count must be >= 1");
    Status status = StartBundle(bundle_id, count, *header, data.size());
    if (!status.ok()) return status;
  }
  if (count != count_) {
    return InvalidArgumentError(where + ": count changed, fragment 0 said " +
                                std::to_string(count_));
  }
  if (index >= count_) return InvalidArgumentError(where + ": index >= count");
  if (seen_[index]) return InvalidArgumentError(where + ": duplicate fragment index");
  if (header != nullptr && index != 0) {
    return InvalidArgumentError(where + ": a second header (only fragment 0 carries one)");
  }
  if (data.size() > limits_.max_fragment_bytes) {
    return ResourceExhaustedError(where + ": " + std::to_string(data.size()) +
                                  " data bytes exceed max_fragment_bytes " +
                                  std::to_string(limits_.max_fragment_bytes));
  }
  const uint64_t start = index * slice_bytes_;  // < wire_bytes: StartBundle checked count
  const uint64_t expected = index + 1 == count_ ? header_.wire_bytes - start : slice_bytes_;
  if (data.size() != expected) {
    return InvalidArgumentError(where + ": carries " + std::to_string(data.size()) +
                                " bytes, expected " + std::to_string(expected) +
                                " (truncated, or overruns wire_bytes " +
                                std::to_string(header_.wire_bytes) + ")");
  }
  std::memcpy(wire_.get() + start, data.data(), data.size());
  seen_[index] = true;
  ++received_;
  return OkStatus();
}

Status Reassembler::StartBundle(uint64_t bundle_id, uint32_t count, const BundleHeader& header,
                                uint64_t first_size) {
  // Checks run in the Python codec's order, so both report the same code for the same input.
  const std::string where = "bundle " + std::to_string(bundle_id) + " header";
  if (header.tensors.empty()) return InvalidArgumentError(where + ": no tensors");
  if (header.tensors.size() > limits_.max_tensors) {
    return ResourceExhaustedError(where + ": " + std::to_string(header.tensors.size()) +
                                  " tensors, the limit is " + std::to_string(limits_.max_tensors));
  }
  if (header.compression != Compression::kNone && header.compression != Compression::kZlib) {
    return InvalidArgumentError(where + ": unknown compression " +
                                std::to_string(static_cast<int32_t>(header.compression)));
  }
  uint64_t offset = 0;  // <= max_tensors * max_bundle_bytes: no overflow
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorSpec& spec = header.tensors[i];
    uint64_t length = 0;
    Status status =
        CheckTensor(i, spec.name, spec.dtype, spec.byte_order, spec.shape, limits_, &length);
    if (!status.ok()) return MakeError(status.code, where + ": " + status.message);
    const std::string what = where + ": tensor " + std::to_string(i) + " '" + spec.name + "'";
    if (spec.length != length) {
      return InvalidArgumentError(what + ": length " + std::to_string(spec.length) + " but " +
                                  DTypeName(spec.dtype) + ShapeString(spec.shape) + " needs " +
                                  std::to_string(length));
    }
    if (spec.offset != offset) {
      return InvalidArgumentError(what + ": offset " + std::to_string(spec.offset) +
                                  ", expected " + std::to_string(offset) +
                                  " (offsets are contiguous from 0)");
    }
    offset += length;
  }
  if (offset != header.payload_bytes) {
    return InvalidArgumentError(where + ": payload_bytes " + std::to_string(header.payload_bytes) +
                                " != sum of tensor lengths " + std::to_string(offset));
  }
  if (header.payload_bytes > limits_.max_bundle_bytes ||
      header.wire_bytes > limits_.max_bundle_bytes) {
    return ResourceExhaustedError(where + ": payload_bytes " +
                                  std::to_string(header.payload_bytes) + " / wire_bytes " +
                                  std::to_string(header.wire_bytes) + " exceed max_bundle_bytes " +
                                  std::to_string(limits_.max_bundle_bytes));
  }
  if (header.wire_bytes == 0) return InvalidArgumentError(where + ": empty wire payload");
  if (header.compression == Compression::kNone && header.wire_bytes != header.payload_bytes) {
    return InvalidArgumentError(where + ": uncompressed bundle with wire_bytes " +
                                std::to_string(header.wire_bytes) + " != payload_bytes " +
                                std::to_string(header.payload_bytes));
  }
  if (count > limits_.max_fragments()) {
    return ResourceExhaustedError(where + ": count " + std::to_string(count) +
                                  " exceeds the limit of " +
                                  std::to_string(limits_.max_fragments()) + " fragments");
  }
  const auto ceil_div = [](uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); };
  if (ceil_div(header.wire_bytes, limits_.max_fragment_bytes) > count) {
    return InvalidArgumentError(where + ": " + std::to_string(count) + " fragments cannot carry " +
                                std::to_string(header.wire_bytes) + " bytes within the limit");
  }
  if (first_size == 0) return InvalidArgumentError(where + ": fragment 0 carries no data");
  if (ceil_div(header.wire_bytes, first_size) != count) {
    return InvalidArgumentError(where + ": " + std::to_string(count) + " slices of " +
                                std::to_string(first_size) + " bytes do not make wire_bytes " +
                                std::to_string(header.wire_bytes) + " (overrun or underrun)");
  }
  wire_.reset(new (std::nothrow) uint8_t[header.wire_bytes]);  // limit-checked above
  if (wire_ == nullptr) {
    return MakeError(Code::kResourceExhausted,
                     where + ": cannot allocate " + std::to_string(header.wire_bytes) + " bytes",
                     /*retryable=*/true);
  }
  active_ = true;
  bundle_id_ = bundle_id;
  count_ = count;
  received_ = 0;
  seen_.assign(count, false);
  slice_bytes_ = first_size;
  header_ = header;
  return OkStatus();
}

Status Reassembler::Take(std::vector<Tensor>* out) {
  if (!complete()) {
    const std::string held = active_ ? std::to_string(received_) + " of " +
                                           std::to_string(count_) + " fragments of bundle " +
                                           std::to_string(bundle_id_)
                                     : "no bundle";
    Reset();
    return InvalidArgumentError("missing fragments: Take() with " + held);
  }
  const BundleHeader header = std::move(header_);
  const std::unique_ptr<uint8_t[]> wire = std::move(wire_);
  Reset();
  std::string decompressed;
  const uint8_t* payload = wire.get();
  if (header.compression == Compression::kZlib) {
    Status status = Decompress(wire.get(), header.wire_bytes, header.payload_bytes, &decompressed);
    if (!status.ok()) return status;
    payload = reinterpret_cast<const uint8_t*>(decompressed.data());
  }

  std::vector<Tensor> tensors(header.tensors.size());
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    const TensorSpec& spec = header.tensors[i];
    const uint8_t* bytes = payload + spec.offset;  // within payload_bytes: StartBundle checked
    const uint32_t crc = Crc32(bytes, spec.length);
    if (crc != spec.crc32) {
      return ChecksumMismatchError("tensor " + std::to_string(i) + " '" + spec.name +
                                   "': crc32 " + Hex32(crc) + " != header's " +
                                   Hex32(spec.crc32));
    }
    Tensor& tensor = tensors[i];
    tensor.name = spec.name;
    tensor.dtype = spec.dtype;
    tensor.shape = spec.shape;
    tensor.bytes.assign(bytes, bytes + spec.length);
    if (spec.byte_order == ByteOrder::kBig) SwapToLittle(ItemSize(spec.dtype), &tensor.bytes);
  }
  *out = std::move(tensors);
  return OkStatus();
}

Status Reassembler::Finish() {
  if (!active_) return OkStatus();
  const bool was_complete = complete();
  const std::string held = std::to_string(received_) + " of " + std::to_string(count_) +
                           " fragments of bundle " + std::to_string(bundle_id_);
  Reset();
  if (was_complete) return InvalidArgumentError("step ended with " + held + " not taken");
  return InvalidArgumentError("missing fragments: step ended with " + held);
}

}  // namespace meshnet::protocol
