#include "cpp/worker/strangers/strangers.h"

#include <gtest/gtest.h>

#include <string>

namespace meshnet::worker {
namespace {

TEST(StrangerStreamsTest, CapsPerPeerAndInAllAndFreesWhatLeaves) {
  StrangerStreams strangers(/*max_total=*/5, /*max_per_peer=*/3);
  std::string why;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(strangers.Admit("10.0.0.1", &why));
  EXPECT_FALSE(strangers.Admit("10.0.0.1", &why));
  EXPECT_EQ(why, "3 streams from 10.0.0.1 have presented no ticket yet");
  EXPECT_TRUE(strangers.Admit("10.0.0.2", &why));
  EXPECT_TRUE(strangers.Admit("10.0.0.3", &why));
  EXPECT_FALSE(strangers.Admit("10.0.0.4", &why));
  EXPECT_EQ(why, "5 streams have presented no ticket yet");
  EXPECT_EQ(strangers.total(), 5);
  strangers.Leave("10.0.0.1");  // authenticated, or ended
  EXPECT_TRUE(strangers.Admit("10.0.0.4", &why));
  strangers.Leave("10.0.0.9");  // never admitted: nothing moves
  EXPECT_EQ(strangers.total(), 5);
}

TEST(StrangerStreamsTest, PeerHosts) {
  EXPECT_EQ(PeerHost("ipv4:10.1.2.3:5678"), "10.1.2.3");
  EXPECT_EQ(PeerHost("ipv6:[::1]:5678"), "::1");
  EXPECT_EQ(PeerHost("unix:/tmp/s"), "unix:/tmp/s");
}

}  // namespace
}  // namespace meshnet::worker
