// Native tensors of the seam protocol, the bundle fragments that carry them (mirrors of
// meshnet.shard.v1.TensorSpec / BundleHeader / TensorFragment), and the f32 <-> f16/bf16
// conversions both codecs share. No protobuf: cpp/protocol/bundle.h fragments, reassembles and
// converts.
//
// A Tensor's bytes are always little-endian and row-major; bytes.size() is expected to equal
// product(shape) * ItemSize(dtype) (EncodeBundle checks it). Conversions are pure functions,
// bit-exact with numpy's astype(np.float16) and torch's scalar float -> bfloat16 rounding.
#ifndef MESHNET_CPP_WIRE_TENSOR_H_
#define MESHNET_CPP_WIRE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshnet::protocol {

// Numbers equal meshnet.shard.v1.DType. A value read from the wire is kept verbatim, so a
// DType may hold a number without a name here (ItemSize returns 0 for it).
enum class DType : int32_t { kUnspecified = 0, kF32 = 1, kF16 = 2, kBF16 = 3 };

// Bytes per element: 4, 2, 2; 0 for an unknown dtype.
size_t ItemSize(DType dtype);
// "f32", "f16", "bf16" or "dtype(<n>)".
std::string DTypeName(DType dtype);

struct Tensor {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;  // little-endian, row-major
};

// Numbers equal the proto enums; values read from the wire are kept verbatim.
enum class Compression : int32_t { kUnspecified = 0, kNone = 1, kZlib = 2 };
enum class ByteOrder : int32_t { kUnspecified = 0, kLittle = 1, kBig = 2 };

// Native mirrors of meshnet.shard.v1.TensorSpec / BundleHeader / TensorFragment.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<uint64_t> shape;
  ByteOrder byte_order = ByteOrder::kUnspecified;
  uint64_t offset = 0;  // into the uncompressed payload
  uint64_t length = 0;  // product(shape) * ItemSize(dtype)
  uint32_t crc32 = 0;   // CRC-32 (zlib) of the tensor's bytes as sent
};

struct BundleHeader {
  std::vector<TensorSpec> tensors;
  Compression compression = Compression::kUnspecified;
  uint64_t payload_bytes = 0;  // uncompressed payload size
  uint64_t wire_bytes = 0;     // size of the payload the fragments carry
};

struct TensorFragment {
  uint64_t bundle_id = 0;
  uint32_t index = 0;
  uint32_t count = 0;
  std::optional<BundleHeader> header;  // fragment 0 only
  std::string data;                    // slice `index` of the wire payload
};

// IEEE binary16 from binary32, round to nearest even; overflow gives +-inf, tiny values give
// subnormals or +-0, NaN stays NaN (sign and top payload bits kept, exactly as numpy does).
uint16_t FloatToHalfBits(float value);
// bfloat16 from binary32, round to nearest even; every NaN becomes 0x7FC0 (as torch does).
uint16_t FloatToBFloat16Bits(float value);
// Exact widenings.
float HalfBitsToFloat(uint16_t bits);
float BFloat16BitsToFloat(uint16_t bits);

// A tensor of `dtype` holding product(shape) values read from `values`, converted as above.
// An unknown dtype yields a tensor with no bytes (which EncodeBundle then refuses).
Tensor TensorFromFloats(std::string name, DType dtype, std::vector<uint64_t> shape,
                        const float* values);
// Every element widened to f32 (exact). Returns an empty vector for an unknown dtype; a
// trailing partial element is ignored.
std::vector<float> TensorToFloats(const Tensor& tensor);

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_WIRE_TENSOR_H_
