// Test fakes for ADR 0003 (testonly): an Ed25519 key that plays the tracker (signs route
// tickets) or a client (signs Results requests), and a self-signed P-256 TLS certificate for
// the name every shard service presents ("meshnet-node"). Never linked into a binary.
// Any thread (the key is immutable after construction).
#ifndef MESHNET_CPP_PROTOCOL_TICKET_SIGNER_FOR_TESTS_H_
#define MESHNET_CPP_PROTOCOL_TICKET_SIGNER_FOR_TESTS_H_

#include <memory>
#include <string>
#include <string_view>

#include "cpp/protocol/seam.h"
#include "cpp/protocol/ticket.h"

namespace meshnet::protocol {

class FakeSigner {
 public:
  FakeSigner();  // a fresh random key
  ~FakeSigner();
  FakeSigner(const FakeSigner&) = delete;
  FakeSigner& operator=(const FakeSigner&) = delete;

  const PublicKey& public_key() const { return public_key_; }
  std::string public_key_bytes() const;  // the 32 raw bytes
  // Ed25519 over context || message.
  std::string Sign(std::string_view context, std::string_view message) const;
  std::string seed() const;  // the raw private key (32 bytes), as a node hands its worker
  // As the tracker: a RouteTicket over EncodeTicketBody(ticket).
  RouteTicket SignTicket(const Ticket& ticket) const;
  // As the client: the ResultsRequest.client_signature for `ticket`.
  std::string SignResults(const RouteTicket& ticket) const;

 private:
  struct Key;
  std::unique_ptr<Key> key_;
  PublicKey public_key_{};
};

struct TlsIdentity {
  std::string certificate_pem;  // self-signed, CN and SAN DNS = the name
  std::string private_key_pem;  // its ECDSA P-256 key (PKCS#8)
};

// A fresh self-signed certificate valid from an hour ago for 30 days.
TlsIdentity MakeSelfSignedTls(const std::string& dns_name = "meshnet-node");

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_PROTOCOL_TICKET_SIGNER_FOR_TESTS_H_
