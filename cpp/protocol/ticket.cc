#include "cpp/protocol/ticket.h"

#include <openssl/evp.h>

#include <climits>
#include <memory>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "meshnet/shard/v1/shard.pb.h"

namespace meshnet::protocol {
namespace pb = ::meshnet::shard::v1;
namespace {

constexpr size_t kKeyBytes = 32, kSignatureBytes = 64;

struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

}  // namespace

bool VerifyEd25519(std::string_view public_key, std::string_view context,
                   std::string_view message, std::string_view signature) {
  if (public_key.size() != kKeyBytes || signature.size() != kSignatureBytes) return false;
  std::unique_ptr<EVP_PKEY, PkeyFree> key(EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_key.data()),
      public_key.size()));
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (key == nullptr || ctx == nullptr) return false;
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1) return false;
  std::string signed_bytes;
  signed_bytes.reserve(context.size() + message.size());
  signed_bytes.append(context).append(message);
  return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(),
                          reinterpret_cast<const unsigned char*>(signed_bytes.data()),
                          signed_bytes.size()) == 1;
}

std::string SignEd25519(std::string_view seed, std::string_view context, std::string_view message) {
  if (seed.size() != kKeyBytes) return "";
  std::unique_ptr<EVP_PKEY, PkeyFree> key(EVP_PKEY_new_raw_private_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(seed.data()), seed.size()));
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  if (key == nullptr || ctx == nullptr) return "";
  if (EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1) return "";
  const std::string input = std::string(context) + std::string(message);
  std::string signature(kSignatureBytes, '\0');
  size_t size = signature.size();
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(input.data()), input.size()) != 1) {
    return "";
  }
  signature.resize(size);
  return signature;
}

Status VerifyTicket(const RouteTicket& ticket, const PublicKey& tracker_key, Ticket* out) {
  std::string_view key(reinterpret_cast<const char*>(tracker_key.data()), tracker_key.size());
  if (!VerifyEd25519(key, kTicketContext, ticket.body, ticket.signature)) {
    return MakeError(Code::kUnauthenticated,
                     "route ticket signature does not verify with the tracker's key");
  }
  pb::TicketBody body;
  if (ticket.body.size() > static_cast<size_t>(INT_MAX) ||
      !body.ParseFromArray(ticket.body.data(), static_cast<int>(ticket.body.size()))) {
    return MakeError(Code::kUnauthenticated, "route ticket body does not parse");
  }
  out->session_id = body.session_id();
  out->epoch = body.epoch();
  out->node_id = body.node_id();
  FromProto(body.range(), &out->range);
  out->downstream_node_id = body.downstream_node_id();
  out->downstream_address = body.downstream_address();
  out->downstream_public_key = body.downstream_public_key();
  out->downstream_tls_certificate = body.downstream_tls_certificate();
  out->client_public_key = body.client_public_key();
  out->client_principal = body.client_principal();
  out->expires_unix_ms = body.expires_unix_ms();
  return OkStatus();
}

Status VerifyResultsSignature(std::string_view client_public_key,
                              std::string_view ticket_signature,
                              std::string_view client_signature) {
  if (client_signature.empty()) {
    return MakeError(Code::kPermissionDenied, "results request without a client signature");
  }
  if (!VerifyEd25519(client_public_key, kResultsContext, ticket_signature, client_signature)) {
    return MakeError(Code::kPermissionDenied,
                     "client signature does not verify with the ticket's client key");
  }
  return OkStatus();
}

std::string EncodeTicketBody(const Ticket& ticket) {
  pb::TicketBody body;
  body.set_session_id(ticket.session_id);
  body.set_epoch(ticket.epoch);
  body.set_node_id(ticket.node_id);
  ToProto(ticket.range, body.mutable_range());
  body.set_downstream_node_id(ticket.downstream_node_id);
  body.set_downstream_address(ticket.downstream_address);
  body.set_downstream_public_key(ticket.downstream_public_key);
  body.set_downstream_tls_certificate(ticket.downstream_tls_certificate);
  body.set_client_public_key(ticket.client_public_key);
  body.set_client_principal(ticket.client_principal);
  body.set_expires_unix_ms(ticket.expires_unix_ms);
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    body.SerializeToCodedStream(&coded);
  }
  return out;
}

bool ParsePublicKeyHex(std::string_view hex, PublicKey* out) {
  if (hex.size() != 2 * kKeyBytes) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  PublicKey key;
  for (size_t i = 0; i < kKeyBytes; ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    key[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  *out = key;
  return true;
}

}  // namespace meshnet::protocol
