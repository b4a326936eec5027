// Route tickets (docs/adr/0003-identities-and-route-tickets.md): verifying the tracker's
// signature on a hop's RouteTicket, opening its TicketBody, and verifying the client's signature
// on a Results request.
//
// Called by the worker's hop admission (cpp/worker/hop.h). Invariant: a Ticket is produced only
// from body bytes whose Ed25519 signature by the tracker key verified over
// "meshnet-ticket-v1\0" || body, and the bytes are parsed as received (never re-serialized), so
// the Python and C++ sides agree without a canonical encoding. Stateless; any thread.
#ifndef MESHNET_CPP_PROTOCOL_TICKET_H_
#define MESHNET_CPP_PROTOCOL_TICKET_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "cpp/protocol/seam.h"
#include "cpp/protocol/status.h"

namespace meshnet::protocol {

using PublicKey = std::array<uint8_t, 32>;  // a raw Ed25519 public key

// Domain separation prefixes, NUL included (the signed message is prefix || payload).
inline constexpr std::string_view kTicketContext{"meshnet-ticket-v1\0", 18};
inline constexpr std::string_view kResultsContext{"meshnet-results-v1\0", 19};
// Issue 17 (docs/adr/0008-verified-outputs.md): the tracker's audit tickets and a node's
// signed commitments.
inline constexpr std::string_view kAuditContext{"meshnet-audit-v1\0", 17};
inline constexpr std::string_view kCommitmentsContext{"meshnet-commitments-v1\0", 23};

// The native form of meshnet.shard.v1.TicketBody: the tracker's permission for one hop of one
// route session at one epoch.
struct Ticket {
  std::string session_id;
  uint64_t epoch = 0;
  std::string node_id;                     // the hop it admits work on
  ShardRange range;                        // that hop's registered range (+ effective start)
  std::string downstream_node_id;          // "" on the last hop
  std::string downstream_address;          // host:port the hop may dial, and no other
  std::string downstream_public_key;       // 32 raw bytes (or empty on the last hop)
  std::string downstream_tls_certificate;  // PEM: the only certificate accepted downstream
  std::string client_public_key;           // 32 raw bytes: who may read the results
  std::string client_principal;
  uint64_t expires_unix_ms = 0;            // wall clock
};

// UNAUTHENTICATED when the signature does not verify with `tracker_key` or the verified body
// does not parse; otherwise fills *out. Checks nothing else (the caller compares the fields).
Status VerifyTicket(const RouteTicket& ticket, const PublicKey& tracker_key, Ticket* out);

// PERMISSION_DENIED unless `client_signature` is an Ed25519 signature by `client_public_key`
// (32 raw bytes) over "meshnet-results-v1\0" || ticket_signature.
Status VerifyResultsSignature(std::string_view client_public_key,
                              std::string_view ticket_signature,
                              std::string_view client_signature);

// True when `signature` is Ed25519 by `public_key` (32 raw bytes) over context || message.
bool VerifyEd25519(std::string_view public_key, std::string_view context,
                   std::string_view message, std::string_view signature);

// Ed25519 signature by the private key `seed` (32 raw bytes) over context || message; "" when
// the seed is not 32 bytes or OpenSSL fails.
std::string SignEd25519(std::string_view seed, std::string_view context, std::string_view message);

// The serialized TicketBody of `ticket` (deterministic): what a tracker signs. Used by tests
// and tools; receivers never re-encode.
std::string EncodeTicketBody(const Ticket& ticket);

// 64 hex digits -> key; false (and *out untouched) on any other input.
bool ParsePublicKeyHex(std::string_view hex, PublicKey* out);

}  // namespace meshnet::protocol

#endif  // MESHNET_CPP_PROTOCOL_TICKET_H_
