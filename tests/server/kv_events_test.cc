// The KV-event publisher against a real ZeroMQ subscriber: the frames, the msgpack payload in
// vLLM's shape (what vllm-router's kv_aware policy decodes), and the block bookkeeping that maps
// prefix snapshots onto fixed-size blocks.
#include "server/kv_events.h"

#include <gtest/gtest.h>
#include <msgpack.h>
#include <zmq.h>

#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace dsinfer::server {
namespace {

// A decoded msgpack value, enough of it for these payloads.
struct Value {
  std::variant<std::monostate, bool, uint64_t, int64_t, double, std::string, std::vector<Value>,
               std::map<std::string, Value>>
      v;
  bool nil() const { return std::holds_alternative<std::monostate>(v); }
  uint64_t u() const { return std::get<uint64_t>(v); }
  const std::string& s() const { return std::get<std::string>(v); }
  const std::vector<Value>& a() const { return std::get<std::vector<Value>>(v); }
  const Value& operator[](const std::string& key) const {
    return std::get<std::map<std::string, Value>>(v).at(key);
  }
  size_t map_size() const { return std::get<std::map<std::string, Value>>(v).size(); }
};

Value Convert(const msgpack_object& o) {
  switch (o.type) {
    case MSGPACK_OBJECT_NIL:
      return {};
    case MSGPACK_OBJECT_BOOLEAN:
      return {o.via.boolean};
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
      return {o.via.u64};
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
      return {o.via.i64};
    case MSGPACK_OBJECT_FLOAT64:
    case MSGPACK_OBJECT_FLOAT32:
      return {o.via.f64};
    case MSGPACK_OBJECT_STR:
      return {std::string(o.via.str.ptr, o.via.str.size)};
    case MSGPACK_OBJECT_ARRAY: {
      std::vector<Value> items;
      for (uint32_t i = 0; i < o.via.array.size; ++i) items.push_back(Convert(o.via.array.ptr[i]));
      return {items};
    }
    case MSGPACK_OBJECT_MAP: {
      std::map<std::string, Value> items;
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const auto& kv = o.via.map.ptr[i];
        EXPECT_EQ(kv.key.type, MSGPACK_OBJECT_STR) << "map keys must be strings";
        items[std::string(kv.key.via.str.ptr, kv.key.via.str.size)] = Convert(kv.val);
      }
      return {items};
    }
    default:
      ADD_FAILURE() << "unexpected msgpack type " << o.type;
      return {};
  }
}

struct Message {
  std::string topic;
  uint64_t seq = 0;
  Value batch;
};

class Subscriber {
 public:
  explicit Subscriber(const std::string& endpoint) {
    context_ = zmq_ctx_new();
    socket_ = zmq_socket(context_, ZMQ_SUB);
    const int timeout_ms = 200;
    zmq_setsockopt(socket_, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
    zmq_setsockopt(socket_, ZMQ_SUBSCRIBE, "", 0);
    EXPECT_EQ(zmq_connect(socket_, endpoint.c_str()), 0) << zmq_strerror(zmq_errno());
  }
  ~Subscriber() {
    zmq_close(socket_);
    zmq_ctx_term(context_);
  }
  std::optional<Message> Receive() {
    std::vector<std::string> frames;
    for (;;) {
      zmq_msg_t part;
      zmq_msg_init(&part);
      if (zmq_msg_recv(&part, socket_, 0) < 0) {
        zmq_msg_close(&part);
        return std::nullopt;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&part)), zmq_msg_size(&part));
      const bool more = zmq_msg_more(&part) != 0;
      zmq_msg_close(&part);
      if (!more) break;
    }
    EXPECT_EQ(frames.size(), 3u);
    if (frames.size() != 3) return std::nullopt;
    Message m;
    m.topic = frames[0];
    EXPECT_EQ(frames[1].size(), 8u);
    for (unsigned char c : frames[1]) m.seq = (m.seq << 8) | c;
    msgpack_unpacked unpacked;
    msgpack_unpacked_init(&unpacked);
    size_t offset = 0;
    EXPECT_EQ(msgpack_unpack_next(&unpacked, frames[2].data(), frames[2].size(), &offset),
              MSGPACK_UNPACK_SUCCESS);
    EXPECT_EQ(offset, frames[2].size()) << "trailing bytes after the batch";
    m.batch = Convert(unpacked.data);
    msgpack_unpacked_destroy(&unpacked);
    return m;
  }

 private:
  void* context_ = nullptr;
  void* socket_ = nullptr;
};

std::vector<int32_t> Range(int32_t from, int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<uint64_t> Uints(const Value& array) {
  std::vector<uint64_t> out;
  for (const auto& x : array.a()) out.push_back(x.u());
  return out;
}

TEST(KvEventPublisher, PublishesVllmShapedBatchesOfWholeBlocks) {
  KvEventOptions options;
  options.bind_endpoint = "tcp://127.0.0.1:*";
  options.topic = "kv";
  options.block_size = 4;
  auto publisher = KvEventPublisher::Start(options);
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  auto& pub = **publisher;
  ASSERT_EQ(pub.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << pub.endpoint();
  Subscriber sub(pub.endpoint());
  // A PUB socket drops what it sends before the subscription arrives: clear until one is seen.
  std::optional<Message> first;
  for (int i = 0; i < 50 && !first; ++i) {
    pub.OnCleared();
    first = sub.Receive();
  }
  ASSERT_TRUE(first.has_value()) << "no message reached the subscriber";
  uint64_t last_seq = first->seq;
  while (auto more = sub.Receive()) last_seq = more->seq;
  EXPECT_EQ(first->topic, "kv");
  ASSERT_EQ(first->batch.a().size(), 3u);  // [ts, events, rank]
  EXPECT_GT(std::get<double>(first->batch.a()[0].v), 1.6e9);
  EXPECT_EQ(first->batch.a()[2].v.index(), 2u);  // rank 0 as an unsigned integer
  ASSERT_EQ(first->batch.a()[1].a().size(), 1u);
  EXPECT_EQ(first->batch.a()[1].a()[0]["type"].s(), "AllBlocksCleared");

  // A 10-token snapshot covers two whole 4-token blocks.
  const std::vector<int32_t> a = Range(100, 10);
  pub.OnStored(a);
  auto stored = sub.Receive();
  ASSERT_TRUE(stored);
  EXPECT_EQ(stored->seq, last_seq + 1) << "sequence numbers must not skip";
  const Value& ev = stored->batch.a()[1].a()[0];
  EXPECT_EQ(ev["type"].s(), "BlockStored");
  EXPECT_EQ(ev.map_size(), 8u);
  const std::vector<uint64_t> hashes = Uints(ev["block_hashes"]);
  ASSERT_EQ(hashes.size(), 2u);
  EXPECT_NE(hashes[0], hashes[1]);
  EXPECT_TRUE(ev["parent_block_hash"].nil());
  EXPECT_EQ(Uints(ev["token_ids"]),
            (std::vector<uint64_t>{100, 101, 102, 103, 104, 105, 106, 107}));
  EXPECT_EQ(ev["block_size"].u(), 4u);
  EXPECT_TRUE(ev["lora_id"].nil());
  EXPECT_TRUE(ev["lora_name"].nil());
  EXPECT_EQ(ev["medium"].s(), "GPU");

  // A longer snapshot of the same prompt adds only its new block, chained to the last one.
  std::vector<int32_t> b = a;
  b.insert(b.end(), {110, 111, 112});
  pub.OnStored(b);
  auto longer = sub.Receive();
  ASSERT_TRUE(longer);
  const Value& ev2 = longer->batch.a()[1].a()[0];
  ASSERT_EQ(Uints(ev2["block_hashes"]).size(), 1u);
  EXPECT_EQ(ev2["parent_block_hash"].u(), hashes[1]);
  EXPECT_EQ(Uints(ev2["token_ids"]), (std::vector<uint64_t>{108, 109, 110, 111}));
  const uint64_t third = Uints(ev2["block_hashes"])[0];

  // The same ids at another position (a different prefix) hash differently.
  std::vector<int32_t> shifted = {7};
  shifted.insert(shifted.end(), a.begin(), a.end());
  pub.OnStored(shifted);
  auto other = sub.Receive();
  ASSERT_TRUE(other);
  for (uint64_t h : Uints(other->batch.a()[1].a()[0]["block_hashes"]))
    EXPECT_TRUE(h != hashes[0] && h != hashes[1] && h != third);

  // Dropping the longer snapshot removes only the block no other snapshot covers.
  pub.OnRemoved(b);
  auto removed = sub.Receive();
  ASSERT_TRUE(removed);
  const Value& ev3 = removed->batch.a()[1].a()[0];
  EXPECT_EQ(ev3["type"].s(), "BlockRemoved");
  EXPECT_EQ(Uints(ev3["block_hashes"]), (std::vector<uint64_t>{third}));
  EXPECT_EQ(ev3["medium"].s(), "GPU");
  // Then the first one: its two blocks go.
  pub.OnRemoved(a);
  auto removed2 = sub.Receive();
  ASSERT_TRUE(removed2);
  EXPECT_EQ(Uints(removed2->batch.a()[1].a()[0]["block_hashes"]), hashes);
  // A snapshot shorter than one block announces nothing.
  pub.OnStored(Range(5, 3));
  pub.OnRemoved(Range(5, 3));
  EXPECT_FALSE(sub.Receive().has_value());
  EXPECT_EQ(pub.batches_dropped(), 0);
}

TEST(KvEventPublisher, RefusesABadEndpoint) {
  KvEventOptions options;
  options.bind_endpoint = "nonsense://x";
  EXPECT_FALSE(KvEventPublisher::Start(options).ok());
  options.bind_endpoint = "tcp://127.0.0.1:*";
  options.block_size = 0;
  EXPECT_FALSE(KvEventPublisher::Start(options).ok());
}

}  // namespace
}  // namespace dsinfer::server
