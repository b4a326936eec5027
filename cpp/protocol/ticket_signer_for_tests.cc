#include "cpp/protocol/ticket_signer_for_tests.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdlib>
#include <cstring>
#include <iostream>

namespace meshnet::protocol {
namespace {

[[noreturn]] void Die(const char* what) {
  std::cerr << "ticket_signer_for_tests: " << what << " failed\n";
  std::abort();
}

std::string DrainBio(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace

struct FakeSigner::Key {
  ~Key() { EVP_PKEY_free(pkey); }
  EVP_PKEY* pkey = nullptr;
};

FakeSigner::FakeSigner() : key_(std::make_unique<Key>()) {
  key_->pkey = EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519");
  if (key_->pkey == nullptr) Die("Ed25519 keygen");
  size_t size = public_key_.size();
  if (EVP_PKEY_get_raw_public_key(key_->pkey, public_key_.data(), &size) != 1 ||
      size != public_key_.size()) {
    Die("EVP_PKEY_get_raw_public_key");
  }
}

FakeSigner::~FakeSigner() = default;

std::string FakeSigner::public_key_bytes() const {
  return std::string(reinterpret_cast<const char*>(public_key_.data()), public_key_.size());
}

std::string FakeSigner::Sign(std::string_view context, std::string_view message) const {
  std::string signature = SignEd25519(seed(), context, message);
  if (signature.empty()) Die("Ed25519 sign");
  return signature;
}

std::string FakeSigner::seed() const {
  std::string seed(32, '\0');
  size_t size = seed.size();
  if (EVP_PKEY_get_raw_private_key(key_->pkey, reinterpret_cast<unsigned char*>(seed.data()), &size) != 1) {
    Die("EVP_PKEY_get_raw_private_key");
  }
  return seed;
}

RouteTicket FakeSigner::SignTicket(const Ticket& ticket) const {
  RouteTicket out;
  out.body = EncodeTicketBody(ticket);
  out.signature = Sign(kTicketContext, out.body);
  return out;
}

std::string FakeSigner::SignResults(const RouteTicket& ticket) const {
  return Sign(kResultsContext, ticket.signature);
}

TlsIdentity MakeSelfSignedTls(const std::string& dns_name) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  if (key == nullptr || cert == nullptr) Die("P-256 keygen");
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert), 30L * 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(dns_name.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  const std::string san = "DNS:" + dns_name;
  for (auto [nid, value] : {std::pair<int, const char*>{NID_subject_alt_name, san.c_str()},
                            {NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (ext == nullptr || X509_add_ext(cert, ext, -1) != 1) Die("X509 extension");
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert, key, EVP_sha256()) == 0) Die("X509_sign");
  TlsIdentity out;
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  out.certificate_pem = DrainBio(bio);
  BIO_free(bio);
  bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  out.private_key_pem = DrainBio(bio);
  BIO_free(bio);
  X509_free(cert);
  EVP_PKEY_free(key);
  return out;
}

}  // namespace meshnet::protocol
