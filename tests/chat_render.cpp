// The C++ side of tests/reference/check_chat_templates.py: renders conversations with
// tlm::chat_template so the script can compare them with jinja2's renderings.
//
//   chat_render CASES.json   ->  one JSON object per case on stdout
//
// CASES.json is a list of {"template": TEXT} or {"name": NAME}, with "messages",
// "add_generation_prompt" and optional "bos_token", "eos_token", "date_string". Each
// output line is {"form": NAME, "text": RENDERING} or {"error": MESSAGE}.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <tlm/text/chat.hpp>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: chat_render CASES.json\n");
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "chat_render: cannot open %s\n", argv[1]);
    return 2;
  }
  const auto cases = nlohmann::json::parse(in);
  for (const auto& c : cases) {
    nlohmann::json out;
    try {
      const auto t = c.contains("name") ? tlm::chat_template::named(c["name"].get<std::string>())
                                        : tlm::chat_template::recognise(c["template"].get<std::string>());
      std::vector<tlm::chat_message> msgs;
      for (const auto& m : c["messages"]) msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      tlm::chat_render_options o;
      if (c.contains("bos_token")) o.bos_token = c["bos_token"].get<std::string>();
      if (c.contains("eos_token")) o.eos_token = c["eos_token"].get<std::string>();
      if (c.contains("date_string")) o.date_string = c["date_string"].get<std::string>();
      out["form"] = std::string(t.name());
      out["text"] = t.render(msgs, c["add_generation_prompt"].get<bool>(), o);
    } catch (const tlm::error& e) {
      out["error"] = e.what();
    }
    std::cout << out.dump() << '\n';
  }
  return 0;
}
