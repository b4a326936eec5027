// Workspace smoke test: one googletest binary that links gRPC, the generated C++ stubs and
// @llama_cpp//:llama, and does real work with each: a bidirectional streaming RPC served and
// called on loopback, and the bundled SmolLM2 GGUF's vocabulary loaded and used to tokenize.
//
// Usage (Bazel passes it): workspace_smoke_test <path to the bundled GGUF>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "llama.h"
#include "meshnet/diag/v1/diag.grpc.pb.h"

namespace {

std::string g_model_path;

namespace diag = meshnet::diag::v1;

class DiagImpl final : public diag::Diag::Service {
 public:
  grpc::Status Ping(grpc::ServerContext*, const diag::PingRequest* request,
                    diag::PingReply* reply) override {
    reply->set_server("cc-smoke:" + request->client());
    reply->set_unix_nanos(1);
    return grpc::Status::OK;
  }

  grpc::Status Echo(grpc::ServerContext*,
                    grpc::ServerReaderWriter<diag::EchoFrame, diag::EchoFrame>* stream) override {
    diag::EchoFrame frame;
    while (stream->Read(&frame)) {
      if (!stream->Write(frame)) break;
    }
    return grpc::Status::OK;
  }
};

class DiagServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override { server_->Shutdown(); }

  DiagImpl service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(DiagServerTest, UnaryPingOnLoopback) {
  auto stub = diag::Diag::NewStub(channel_);
  grpc::ClientContext ctx;
  diag::PingRequest request;
  request.set_client("gtest");
  diag::PingReply reply;
  ASSERT_TRUE(stub->Ping(&ctx, request, &reply).ok());
  EXPECT_EQ(reply.server(), "cc-smoke:gtest");
}

TEST_F(DiagServerTest, BidiEchoStreamKeepsOrderAndBytes) {
  auto stub = diag::Diag::NewStub(channel_);
  grpc::ClientContext ctx;
  auto stream = stub->Echo(&ctx);
  constexpr int kFrames = 100;
  for (int i = 0; i < kFrames; ++i) {
    diag::EchoFrame out;
    out.set_seq(i);
    out.set_payload(std::string(static_cast<size_t>(i) * 31, static_cast<char>('a' + i % 26)));
    ASSERT_TRUE(stream->Write(out));
    diag::EchoFrame in;
    ASSERT_TRUE(stream->Read(&in));
    EXPECT_EQ(in.seq(), static_cast<uint64_t>(i));
    EXPECT_EQ(in.payload(), out.payload());
  }
  stream->WritesDone();
  diag::EchoFrame extra;
  EXPECT_FALSE(stream->Read(&extra));
  EXPECT_TRUE(stream->Finish().ok());
}

struct ModelDeleter {
  void operator()(llama_model* m) const { llama_model_free(m); }
};

TEST(BundledModelVocab, LoadsAndTokenizesRoundTrip) {
  ASSERT_FALSE(g_model_path.empty()) << "pass the GGUF path as the first argument";
  llama_backend_init();
  llama_model_params params = llama_model_default_params();
  params.vocab_only = true;
  std::unique_ptr<llama_model, ModelDeleter> model(
      llama_model_load_from_file(g_model_path.c_str(), params));
  ASSERT_NE(model, nullptr) << "cannot load " << g_model_path;

  // SmolLM2-135M: 30 layers, n_embd 576, a 49152-token vocabulary. (A vocab-only load reads
  // the GGUF metadata but not the hyperparameters, so read those from the metadata.)
  char value[64] = {0};
  ASSERT_GT(llama_model_meta_val_str(model.get(), "llama.block_count", value, sizeof(value)), 0);
  EXPECT_STREQ(value, "30");
  ASSERT_GT(llama_model_meta_val_str(model.get(), "llama.embedding_length", value, sizeof(value)), 0);
  EXPECT_STREQ(value, "576");
  const llama_vocab* vocab = llama_model_get_vocab(model.get());
  EXPECT_EQ(llama_vocab_n_tokens(vocab), 49152);

  const std::string text = "The capital of France is";
  std::vector<llama_token> tokens(64);
  const int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()),
                                   tokens.data(), static_cast<int32_t>(tokens.size()),
                                   /*add_special=*/false, /*parse_special=*/false);
  ASSERT_GT(n, 1);
  ASSERT_LT(n, static_cast<int32_t>(text.size()));  // BPE merges: fewer tokens than bytes
  tokens.resize(n);

  std::string back(256, '\0');
  const int32_t len = llama_detokenize(vocab, tokens.data(), n, back.data(),
                                       static_cast<int32_t>(back.size()),
                                       /*remove_special=*/false, /*unparse_special=*/false);
  ASSERT_GT(len, 0);
  back.resize(len);
  EXPECT_EQ(back, text);
  llama_backend_free();
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) g_model_path = argv[1];
  return RUN_ALL_TESTS();
}
