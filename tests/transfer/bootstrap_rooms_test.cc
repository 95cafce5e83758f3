// sglang-router's bootstrap rooms (transfer/bootstrap_rooms.h): a room is taken once, a Take
// waits for a later Publish and gives up at its deadline, a room published twice is refused, a
// failure travels as the room's entry, and an untaken room expires after the ttl.
#include "transfer/bootstrap_rooms.h"

#include <gtest/gtest.h>

#include <thread>

namespace dsinfer::transfer {
namespace {

using std::chrono::milliseconds;
using Clock = BootstrapRooms::Clock;

TransferDescriptor Descriptor(uint64_t handle) {
  TransferDescriptor d;
  d.engine_id = "test";
  d.handle = handle;
  return d;
}

TEST(BootstrapRoomsTest, PublishedRoomIsTakenOnce) {
  BootstrapRooms rooms(milliseconds(60000));
  ASSERT_TRUE(rooms.Publish(7, std::optional<TransferDescriptor>(Descriptor(42))).ok());
  EXPECT_EQ(rooms.Stats().waiting_rooms, 1);
  auto entry = rooms.Take(7, Clock::now());
  ASSERT_TRUE(entry.has_value());
  ASSERT_TRUE(entry->ok());
  ASSERT_TRUE(entry->value().has_value());
  EXPECT_EQ(entry->value()->handle, 42u);
  EXPECT_FALSE(rooms.Take(7, Clock::now()).has_value());
  const auto stats = rooms.Stats();
  EXPECT_EQ(stats.waiting_rooms, 0);
  EXPECT_EQ(stats.published_total, 1);
  EXPECT_EQ(stats.taken_total, 1);
}

TEST(BootstrapRoomsTest, TakeWaitsForALaterPublish) {
  BootstrapRooms rooms(milliseconds(60000));
  std::thread publisher([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE(rooms.Publish(1, std::optional<TransferDescriptor>(Descriptor(5))).ok());
  });
  const auto t0 = Clock::now();
  auto entry = rooms.Take(1, t0 + milliseconds(5000));
  publisher.join();
  ASSERT_TRUE(entry.has_value() && entry->ok() && entry->value().has_value());
  EXPECT_EQ(entry->value()->handle, 5u);
  EXPECT_GE(Clock::now() - t0, milliseconds(90));
}

TEST(BootstrapRoomsTest, TakeGivesUpAtItsDeadline) {
  BootstrapRooms rooms(milliseconds(60000));
  ASSERT_TRUE(rooms.Publish(2, std::optional<TransferDescriptor>()).ok());  // another room
  const auto t0 = Clock::now();
  EXPECT_FALSE(rooms.Take(3, t0 + milliseconds(100)).has_value());
  EXPECT_GE(Clock::now() - t0, milliseconds(100));
  EXPECT_EQ(rooms.Stats().waiting_rooms, 1);
}

TEST(BootstrapRoomsTest, FailuresAndShortPromptsTravel) {
  BootstrapRooms rooms(milliseconds(60000));
  ASSERT_TRUE(rooms.Publish(4, Internal("the prefill failed")).ok());
  ASSERT_TRUE(rooms.Publish(5, std::optional<TransferDescriptor>()).ok());
  auto failed = rooms.Take(4, Clock::now());
  ASSERT_TRUE(failed.has_value());
  ASSERT_FALSE(failed->ok());
  EXPECT_EQ(failed->status().message(), "the prefill failed");
  auto empty = rooms.Take(5, Clock::now());
  ASSERT_TRUE(empty.has_value() && empty->ok());
  EXPECT_FALSE(empty->value().has_value());
}

TEST(BootstrapRoomsTest, ARoomPublishedTwiceIsRefused) {
  BootstrapRooms rooms(milliseconds(60000));
  ASSERT_TRUE(rooms.Publish(9, std::optional<TransferDescriptor>()).ok());
  const Status again = rooms.Publish(9, std::optional<TransferDescriptor>());
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("already published"), std::string::npos);
}

TEST(BootstrapRoomsTest, AnUntakenRoomExpires) {
  BootstrapRooms rooms(milliseconds(50));
  ASSERT_TRUE(rooms.Publish(11, std::optional<TransferDescriptor>()).ok());
  std::this_thread::sleep_for(milliseconds(80));
  EXPECT_FALSE(rooms.Take(11, Clock::now()).has_value());
  EXPECT_EQ(rooms.Stats().expired_total, 1);
  EXPECT_EQ(rooms.Stats().waiting_rooms, 0);
}

}  // namespace
}  // namespace dsinfer::transfer
