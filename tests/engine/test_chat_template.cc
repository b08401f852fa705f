// The chat template interpreter on small inline templates.
#include <gtest/gtest.h>

#include "engine/chat/chat_template.h"

namespace {

using flexh2o::engine::chat::ChatInputs;
using flexh2o::engine::chat::ChatTemplate;

std::string render(const std::string& src, ChatInputs in = {}) { return ChatTemplate(src, "t").render(in); }

TEST(ChatTemplate, Text) { EXPECT_EQ(render("hello"), "hello"); }

}  // namespace
