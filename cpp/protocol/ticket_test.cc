// Route tickets: the tracker's signature is checked over "meshnet-ticket-v1\0" || body as
// received, the body is opened only after it verifies, and a Results request's client
// signature binds it to the ticket (ADR 0003). Ed25519 itself is checked against RFC 8032.
#include "cpp/protocol/ticket.h"

#include <gtest/gtest.h>

#include <string>

#include "cpp/protocol/ticket_signer_for_tests.h"

namespace meshnet::protocol {
namespace {

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

Ticket SampleTicket() {
  Ticket ticket;
  ticket.session_id = "s-1";
  ticket.epoch = 3;
  ticket.node_id = "n" + std::string(40, 'a');
  ticket.range = ShardRange{2, 4, 2};
  ticket.downstream_node_id = "n" + std::string(40, 'b');
  ticket.downstream_address = "127.0.0.1:5000";
  ticket.downstream_public_key = std::string(32, '\x07');
  ticket.downstream_tls_certificate = "-----BEGIN CERTIFICATE-----\n...\n";
  ticket.client_public_key = std::string(32, '\x09');
  ticket.client_principal = "c" + std::string(40, 'c');
  ticket.expires_unix_ms = 1'900'000'000'000;
  return ticket;
}

TEST(TicketTest, Rfc8032Vector) {  // RFC 8032 section 7.1, TEST 1 (empty message)
  const std::string key =
      Unhex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
  const std::string signature = Unhex(
      "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e3970"
      "1cf9b46bd25bf5f0595bbe24655141438e7a100b");
  EXPECT_TRUE(VerifyEd25519(key, "", "", signature));
  EXPECT_FALSE(VerifyEd25519(key, "", "x", signature));
  EXPECT_FALSE(VerifyEd25519(key.substr(1), "", "", signature));
  EXPECT_FALSE(VerifyEd25519(key, "", "", signature.substr(1)));
}

TEST(TicketTest, VerifiesThenOpensTheBody) {
  FakeSigner tracker;
  const Ticket in = SampleTicket();
  RouteTicket signed_ticket = tracker.SignTicket(in);
  Ticket out;
  ASSERT_TRUE(VerifyTicket(signed_ticket, tracker.public_key(), &out).ok());
  EXPECT_EQ(out.session_id, in.session_id);
  EXPECT_EQ(out.epoch, in.epoch);
  EXPECT_EQ(out.node_id, in.node_id);
  EXPECT_EQ(out.range.layer_start, 2u);
  EXPECT_EQ(out.range.layer_end, 4u);
  EXPECT_EQ(out.downstream_node_id, in.downstream_node_id);
  EXPECT_EQ(out.downstream_address, in.downstream_address);
  EXPECT_EQ(out.downstream_public_key, in.downstream_public_key);
  EXPECT_EQ(out.downstream_tls_certificate, in.downstream_tls_certificate);
  EXPECT_EQ(out.client_public_key, in.client_public_key);
  EXPECT_EQ(out.client_principal, in.client_principal);
  EXPECT_EQ(out.expires_unix_ms, in.expires_unix_ms);
}

TEST(TicketTest, RefusesWhatDoesNotVerify) {
  FakeSigner tracker, other;
  RouteTicket good = tracker.SignTicket(SampleTicket());
  Ticket out;
  EXPECT_EQ(VerifyTicket(good, other.public_key(), &out).code, Code::kUnauthenticated);
  RouteTicket tampered = good;
  tampered.body[tampered.body.size() - 1] ^= 1;
  EXPECT_EQ(VerifyTicket(tampered, tracker.public_key(), &out).code, Code::kUnauthenticated);
  RouteTicket unsigned_ticket{good.body, ""};
  EXPECT_EQ(VerifyTicket(unsigned_ticket, tracker.public_key(), &out).code,
            Code::kUnauthenticated);
  // Without the NUL of the context (or with another context) the signature is another one.
  RouteTicket no_nul{good.body, tracker.Sign("meshnet-ticket-v1", good.body)};
  EXPECT_EQ(VerifyTicket(no_nul, tracker.public_key(), &out).code, Code::kUnauthenticated);
  RouteTicket results_context{good.body, tracker.Sign(kResultsContext, good.body)};
  EXPECT_EQ(VerifyTicket(results_context, tracker.public_key(), &out).code,
            Code::kUnauthenticated);
  // Signed bytes that are not a TicketBody.
  RouteTicket garbage{"\xff\xff\xff", tracker.Sign(kTicketContext, "\xff\xff\xff")};
  Status status = VerifyTicket(garbage, tracker.public_key(), &out);
  EXPECT_EQ(status.code, Code::kUnauthenticated);
  EXPECT_NE(status.message.find("parse"), std::string::npos);
}

TEST(TicketTest, ResultsSignatureBindsTheClientToTheTicket) {
  FakeSigner tracker, client, stranger;
  Ticket body = SampleTicket();
  body.client_public_key = client.public_key_bytes();
  RouteTicket ticket = tracker.SignTicket(body);
  EXPECT_TRUE(VerifyResultsSignature(body.client_public_key, ticket.signature,
                                     client.SignResults(ticket))
                  .ok());
  EXPECT_EQ(VerifyResultsSignature(body.client_public_key, ticket.signature,
                                   stranger.SignResults(ticket))
                .code,
            Code::kPermissionDenied);
  EXPECT_EQ(VerifyResultsSignature(body.client_public_key, ticket.signature, "").code,
            Code::kPermissionDenied);
  RouteTicket other = tracker.SignTicket(SampleTicket());
  EXPECT_EQ(VerifyResultsSignature(body.client_public_key, ticket.signature,
                                   client.SignResults(other))
                .code,
            Code::kPermissionDenied);
}

TEST(TicketTest, ParsesTrackerKeyHex) {
  PublicKey key{};
  EXPECT_TRUE(ParsePublicKeyHex(std::string(62, '0') + "Af", &key));
  EXPECT_EQ(key[31], 0xaf);
  EXPECT_FALSE(ParsePublicKeyHex(std::string(63, '0'), &key));
  EXPECT_FALSE(ParsePublicKeyHex(std::string(62, '0') + "zz", &key));
}

TEST(TicketTest, SelfSignedTlsIsPem) {
  TlsIdentity tls = MakeSelfSignedTls();
  EXPECT_EQ(tls.certificate_pem.rfind("-----BEGIN CERTIFICATE-----", 0), 0u);
  EXPECT_NE(tls.private_key_pem.find("PRIVATE KEY-----"), std::string::npos);
}

}  // namespace
}  // namespace meshnet::protocol
