#include "echelon/serve/openai_server.h"

#include <httplib.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "echelon/model/checkpoint.h"
#include "echelon/model/generate.h"
#include "echelon/model/testing.h"
#include "echelon/tokenizer/tokenizer.h"

namespace echelon::serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kAlphabet = "0123456789+-= abcdefgh\n";

model::ModelConfig TinyConfig(int64_t vocab, int64_t hidden) { return model::TinyTestConfig(vocab, hidden); }

// A served echelon checkpoint (character tokenizer) and a local copy of the same weights.
class OpenAiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("echelon_serve_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    tok_ = model::CharTokenizer::ForAlphabet(kAlphabet);
    dir_ = Save("a", 32, 11);
    Result<model::TextModel> served = model::LoadModelDir(dir_);
    ASSERT_TRUE(served.ok()) << served.status().message();
    ServeOptions o;
    o.served_model_name = "tiny";
    Result<std::unique_ptr<OpenAiServer>> s = OpenAiServer::Create(std::move(served).value(), o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(std::chrono::seconds(120));
    local_ = Load(dir_);
  }
  void TearDown() override {
    client_.reset();
    if (server_) server_->Stop();
    fs::remove_all(root_);
  }

  std::string Save(const std::string& name, int64_t hidden, uint64_t seed) {
    model::Qwen3Model m(TinyConfig(tok_.vocab_size(), hidden));
    m->InitWeights(seed);
    const std::string dir = (root_ / name).string();
    EXPECT_TRUE(model::SaveCheckpoint(dir, m, tok_).ok());
    return dir;
  }
  model::Qwen3Model Load(const std::string& dir) {
    Result<model::TextModel> m = model::LoadModelDir(dir);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m->model;
  }
  std::vector<int64_t> Prompt(const std::string& text) {
    std::vector<int64_t> ids = tok_.Encode(text).value();
    ids.insert(ids.begin(), model::CharTokenizer::kBos);
    return ids;
  }
  std::vector<model::Completion> Local(model::Qwen3Model& m, const std::vector<std::vector<int64_t>>& prompts,
                                       double temperature, int64_t max_tokens, uint64_t seed = 0) {
    model::SamplingParams sp;
    sp.temperature = temperature;
    sp.max_new_tokens = max_tokens;
    sp.eos_token_id = model::CharTokenizer::kEos;
    sp.seed = seed;
    m->eval();
    return model::Generate(m, prompts, sp);
  }
  std::pair<int, json> Post(const std::string& path, const json& body) {
    httplib::Result r = client_->Post(path.c_str(), body.dump(), "application/json");
    EXPECT_TRUE(r) << path;
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  // The parsed `data:` events of a streamed response (the last is the string "[DONE]").
  std::vector<json> PostStream(const std::string& path, const json& body) {
    std::string raw;
    httplib::Result r = client_->Post(
        path.c_str(), httplib::Headers{}, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    raw = r->body;
    std::vector<json> events;
    size_t at = 0;
    while ((at = raw.find("data: ", at)) != std::string::npos) {
      const size_t end = raw.find("\n\n", at);
      const std::string payload = raw.substr(at + 6, end - at - 6);
      events.push_back(payload == "[DONE]" ? json("[DONE]") : json::parse(payload));
      at = end;
    }
    return events;
  }
  static void ExpectLogprobsEqual(const json& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].get<float>(), want[i]) << "token " << i;
  }

  fs::path root_;
  model::CharTokenizer tok_;
  std::string dir_;
  std::unique_ptr<OpenAiServer> server_;
  std::unique_ptr<httplib::Client> client_;
  model::Qwen3Model local_{nullptr};
};

TEST_F(OpenAiServerTest, GreedyCompletionEqualsLocalGeneration) {
  auto [status, r] = Post("/v1/completions", {{"model", "tiny"},
                                              {"prompt", "12+34="},
                                              {"max_tokens", 12},
                                              {"temperature", 0},
                                              {"logprobs", 0},
                                              {"return_token_ids", true}});
  ASSERT_EQ(status, 200) << r.dump();
  const model::Completion want = Local(local_, {Prompt("12+34=")}, 0.0, 12)[0];
  const json& c = r["choices"][0];
  EXPECT_EQ(c["prompt_token_ids"].get<std::vector<int64_t>>(), Prompt("12+34="));
  EXPECT_EQ(c["token_ids"].get<std::vector<int64_t>>(), want.tokens);
  ExpectLogprobsEqual(c["logprobs"]["token_logprobs"], want.logprobs);
  EXPECT_EQ(c["text"], tok_.Decode(want.tokens));
  EXPECT_EQ(c["finish_reason"], want.finished_eos ? "stop" : "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(r["usage"]["completion_tokens"], want.tokens.size());
  EXPECT_EQ(r["model"], "tiny");
  EXPECT_EQ(r["object"], "text_completion");
}

TEST_F(OpenAiServerTest, SeededBatchEqualsLocalBatch) {
  // Two prompts x n=2 are one batch of four rows, in OpenAI's choice order.
  auto [status, r] = Post("/v1/completions", {{"prompt", json::array({"1+1=", "99-3="})},
                                              {"n", 2},
                                              {"max_tokens", 6},
                                              {"temperature", 1.0},
                                              {"seed", 1234},
                                              {"logprobs", 1},
                                              {"return_token_ids", true}});
  ASSERT_EQ(status, 200) << r.dump();
  const auto want = Local(local_, {Prompt("1+1="), Prompt("1+1="), Prompt("99-3="), Prompt("99-3=")}, 1.0, 6, 1234);
  ASSERT_EQ(r["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const json& c = r["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["token_ids"].get<std::vector<int64_t>>(), want[i].tokens) << "choice " << i;
    ExpectLogprobsEqual(c["logprobs"]["token_logprobs"], want[i].logprobs);
  }
  // Not all four rows drew the same thing (the seed drives one batch, not copies).
  EXPECT_NE(r["choices"][0]["token_ids"], r["choices"][1]["token_ids"]);
}

TEST_F(OpenAiServerTest, StreamedTextEqualsNonStreamedText) {
  const json body = {{"prompt", "7+8="}, {"max_tokens", 16}, {"temperature", 0}, {"logprobs", 0}};
  auto [status, whole] = Post("/v1/completions", body);
  ASSERT_EQ(status, 200);
  json sbody = body;
  sbody["stream"] = true;
  sbody["stream_options"] = {{"include_usage", true}};
  const std::vector<json> events = PostStream("/v1/completions", sbody);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json& usage = events[events.size() - 2];
  EXPECT_EQ(usage["usage"], whole["usage"]);
  std::string text;
  std::vector<float> lps;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json& c = events[i]["choices"][0];
    text += c["text"].get<std::string>();
    for (const json& x : c["logprobs"]["token_logprobs"]) lps.push_back(x.get<float>());
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(text, whole["choices"][0]["text"]);
  ExpectLogprobsEqual(whole["choices"][0]["logprobs"]["token_logprobs"], lps);
  EXPECT_EQ(finish, whole["choices"][0]["finish_reason"]);

  // Chat, with the plain fallback template: the prompt is the message's text after BOS.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "7+8="}}}},
                     {"max_tokens", 16},
                     {"temperature", 0},
                     {"logprobs", true},
                     {"return_token_ids", true}};
  auto [cstatus, cwhole] = Post("/v1/chat/completions", chat);
  ASSERT_EQ(cstatus, 200) << cwhole.dump();
  EXPECT_EQ(cwhole["choices"][0]["prompt_token_ids"].get<std::vector<int64_t>>(), Prompt("7+8="));
  EXPECT_EQ(cwhole["choices"][0]["message"]["content"], whole["choices"][0]["text"]);
  json cs = chat;
  cs["stream"] = true;
  const std::vector<json> cevents = PostStream("/v1/chat/completions", cs);
  ASSERT_GE(cevents.size(), 2u);
  EXPECT_EQ(cevents[0]["choices"][0]["delta"]["role"], "assistant");
  std::string ctext;
  size_t tokens = 0;
  for (size_t i = 0; i + 1 < cevents.size(); ++i) {
    const json& c = cevents[i]["choices"][0];
    if (c["delta"].contains("content")) ctext += c["delta"]["content"].get<std::string>();
    if (c["logprobs"].is_object()) tokens += c["logprobs"]["content"].size();
  }
  EXPECT_EQ(ctext, cwhole["choices"][0]["message"]["content"]);
  EXPECT_EQ(tokens, cwhole["choices"][0]["logprobs"]["content"].size());
}

TEST_F(OpenAiServerTest, StopStringsCutTheText) {
  auto [status, r] = Post("/v1/completions", {{"prompt", "5+5="}, {"max_tokens", 20}, {"temperature", 0}});
  ASSERT_EQ(status, 200);
  const std::string text = r["choices"][0]["text"];
  ASSERT_GE(text.size(), 3u) << "the fixture's greedy text is too short to pick a stop string";
  const std::string stop = text.substr(2, 1);
  auto [s2, cut] = Post("/v1/completions", {{"prompt", "5+5="}, {"max_tokens", 20}, {"temperature", 0}, {"stop", stop}});
  ASSERT_EQ(s2, 200);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_F(OpenAiServerTest, BadRequestsGetOpenAiErrors) {
  auto expect_error = [&](const std::string& path, const json& body, int status, const std::string& param,
                          const std::string& part) {
    auto [s, r] = Post(path, body);
    EXPECT_EQ(s, status) << body.dump() << " -> " << r.dump();
    EXPECT_EQ(r["error"]["param"], param) << r.dump();
    EXPECT_NE(r["error"]["message"].get<std::string>().find(part), std::string::npos) << r.dump();
  };
  expect_error("/v1/completions", {{"prompt", "1"}, {"temperature", 5}}, 400, "temperature", "[0.0, 2.0]");
  expect_error("/v1/completions", {{"model", "other"}, {"prompt", "1"}}, 404, "model", "`other` does not exist");
  expect_error("/v1/completions", {{"prompt", "XYZ"}}, 400, "prompt", "cannot be tokenized");
  expect_error("/v1/completions", {{"prompt", json::array({1, 999})}}, 400, "prompt", "outside the vocabulary");
  expect_error("/v1/completions", {{"prompt", "1"}, {"max_tokens", 100}}, 400, "max_tokens",
               "maximum context length is 64");
  expect_error("/v1/completions", {{"prompt", "1"}, {"stop_token_ids", {500}}}, 400, "stop_token_ids", "outside");
  expect_error("/v1/chat/completions", {{"messages", {{{"role", "tool"}, {"content", "x"}}}}}, 400,
               "messages[0].role", "\"tool\" is not supported");
  httplib::Result r = client_->Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "not_found_error");
}

TEST_F(OpenAiServerTest, ModelsAndHealth) {
  httplib::Result m = client_->Get("/v1/models");
  ASSERT_TRUE(m);
  const json models = json::parse(m->body);
  EXPECT_EQ(models["data"][0]["id"], "tiny");
  EXPECT_EQ(models["data"][0]["max_model_len"], 64);
  httplib::Result h = client_->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST_F(OpenAiServerTest, UpdateWeightsSwapsAndRefusesMismatches) {
  const json greedy = {{"prompt", "3+4="}, {"max_tokens", 10}, {"temperature", 0}, {"return_token_ids", true}};
  const std::string other = Save("b", 32, 99);
  auto [s, r] = Post("/update_weights_from_disk", {{"model_path", other}});
  ASSERT_EQ(s, 200) << r.dump();
  EXPECT_TRUE(r["success"].get<bool>());
  model::Qwen3Model b = Load(other);
  const std::vector<int64_t> want_b = Local(b, {Prompt("3+4=")}, 0.0, 10)[0].tokens;
  const std::vector<int64_t> want_a = Local(local_, {Prompt("3+4=")}, 0.0, 10)[0].tokens;
  ASSERT_NE(want_a, want_b) << "two seeds gave the same greedy output; the test cannot tell them apart";
  EXPECT_EQ(Post("/v1/completions", greedy).second["choices"][0]["token_ids"].get<std::vector<int64_t>>(), want_b);
  httplib::Result models = client_->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["root"], other);

  const std::string wide = Save("wide", 48, 5);
  auto [s2, r2] = Post("/update_weights_from_disk", {{"model_path", wide}});
  EXPECT_EQ(s2, 400);
  EXPECT_FALSE(r2["success"].get<bool>());
  EXPECT_NE(r2["message"].get<std::string>().find("config.json field head_dim (8 vs 12)"), std::string::npos) << r2.dump();
  EXPECT_NE(r2["message"].get<std::string>().find("the old weights stay"), std::string::npos) << r2.dump();
  auto [s3, r3] = Post("/update_weights_from_disk", {{"model_path", (root_ / "missing").string()}});
  EXPECT_EQ(s3, 400);
  EXPECT_NE(r3["message"].get<std::string>().find("does not exist"), std::string::npos) << r3.dump();
  // The refused loads left b's weights in place.
  EXPECT_EQ(Post("/v1/completions", greedy).second["choices"][0]["token_ids"].get<std::vector<int64_t>>(), want_b);
}

}  // namespace
}  // namespace echelon::serve
