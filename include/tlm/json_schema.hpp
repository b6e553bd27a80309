#pragma once
// A JSON Schema subset, read with nlohmann::json (Debian's nlohmann-json3-dev), compiled
// to a tlm::json_grammar node. Supported: "type" object (with "properties"; every
// property must be listed in "required", and they are written in declared order),
// string, number, integer, boolean, array (with "items" and "minItems"), and "enum".
// Anything else is refused with an error naming the keyword, rather than ignored.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <string_view>

#include "grammar.hpp"

namespace tlm::json_schema {

namespace detail {

inline json_node compile(const nlohmann::ordered_json& s, const std::string& where) {
  const auto fail = [&](const std::string& what) -> json_node {
    throw error("json schema at " + where + ": " + what);
  };
  if (!s.is_object()) return fail("a schema must be an object such as {\"type\": \"string\"}");
  if (s.contains("enum")) {
    const auto& e = s["enum"];
    if (!e.is_array() || e.empty()) return fail("\"enum\" must be a non-empty array; an empty one admits nothing");
    std::vector<std::string> texts;
    for (const auto& v : e) texts.push_back(v.dump());
    return enumeration(std::move(texts));
  }
  if (!s.contains("type") || !s["type"].is_string())
    return fail("needs \"type\" (object, string, number, integer, boolean or array) or \"enum\"");
  const std::string type = s["type"];
  for (const auto& [key, value] : s.items()) {
    static const std::vector<std::string> known = {"type", "properties", "required", "items", "minItems", "description",
                                                   "title", "additionalProperties", "$schema"};
    if (std::find(known.begin(), known.end(), key) == known.end())
      return fail("the keyword \"" + key + "\" is not supported by tlm's schema subset; remove it");
  }
  if (type == "string") return string();
  if (type == "number") return number();
  if (type == "integer") return integer();
  if (type == "boolean") return boolean();
  if (type == "array") {
    if (!s.contains("items")) return fail("an array needs \"items\"");
    std::size_t min_items = 0;
    if (s.contains("minItems")) {
      if (!s["minItems"].is_number_unsigned()) return fail("\"minItems\" must be a whole number");
      min_items = s["minItems"];
    }
    return array(compile(s["items"], where + ".items"), min_items);
  }
  if (type == "object") {
    std::vector<std::pair<std::string, json_node>> props;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return fail("\"properties\" must be an object");
      for (const auto& [key, value] : s["properties"].items()) props.emplace_back(key, compile(value, where + "." + key));
    }
    std::vector<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return fail("\"required\" must be an array of property names");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) return fail("\"required\" must be an array of property names");
        required.push_back(r);
      }
    }
    for (const auto& [key, value] : props)
      if (std::find(required.begin(), required.end(), key) == required.end())
        return fail("property \"" + key + "\" is optional; tlm writes every property, so list it in \"required\"");
    for (const auto& r : required) {
      if (std::none_of(props.begin(), props.end(), [&](const auto& p) { return p.first == r; }))
        return fail("\"" + r + "\" is required but has no schema in \"properties\", so nothing is admitted");
    }
    return object(std::move(props));
  }
  return fail("the type \"" + type + "\" is not one of object, string, number, integer, boolean, array");
}

}  // namespace detail

// Compiles schema text; a schema outside the subset, or one that admits nothing, is an error.
inline json_node from_text(std::string_view text) {
  nlohmann::ordered_json s;
  try {
    s = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw error(std::string("json schema: not valid JSON: ") + e.what());
  }
  return detail::compile(s, "$");
}

}  // namespace tlm::json_schema
