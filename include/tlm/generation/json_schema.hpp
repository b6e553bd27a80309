#pragma once
// A JSON Schema subset, read with nlohmann::json (Debian's nlohmann-json3-dev), compiled
// to a tlm::json_grammar node. Supported: "type" object (with "properties"; every
// property must be listed in "required", and they are written in declared order),
// string, number, integer, boolean, array (with "items" and "minItems"), and "enum".
// Anything else is refused with an error naming the keyword, rather than ignored.
//
// A schema is compiled recursively, so its size and depth are checked first, without
// recursion: the text's nesting before it is parsed, the parsed value's count of values
// before it is compiled. A schema nested 20,000 levels deep is then a cheap error, not a
// stack overflow, and a long chain of "properties" is not compiled before it is refused.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <tlm/generation/grammar.hpp>

namespace tlm {

// The deepest nesting of arrays and objects in JSON text, counted in one pass without
// parsing (brackets inside strings do not count), stopping once it passes `stop_above`.
// Text too deep for a recursive walk can so be refused before anything recurses over it.
inline std::size_t json_nesting_depth(std::string_view text, std::size_t stop_above = static_cast<std::size_t>(-1)) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_above) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace tlm

namespace tlm::json_schema {

// What a schema may be before it is compiled. The grammar takes 8 levels of nested
// schemas; a level is up to two JSON levels ("properties" and the property's schema),
// and enum values may nest too, hence 32. The count bounds the compile and the
// grammar's per-token work.
struct schema_limits {
  std::size_t max_depth = 32;     // nested arrays and objects in the schema's JSON
  std::size_t max_values = 1024;  // JSON values in the schema (every key's value, item, string, number...)
};

// Checks a parsed schema against the limits, iteratively (an explicit stack, no recursion).
inline void check_limits(const nlohmann::ordered_json& schema, const schema_limits& lim = {}) {
  std::vector<std::pair<const nlohmann::ordered_json*, std::size_t>> todo{{&schema, 1}};
  std::size_t values = 0;
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (++values > lim.max_values)
      throw error("json schema: more than " + std::to_string(lim.max_values) + " JSON values; tlm takes schemas up to that " +
                  "size, so simplify it");
    if (!v->is_structured()) continue;
    if (depth > lim.max_depth)
      throw error("json schema: nested more than " + std::to_string(lim.max_depth) + " arrays and objects deep; tlm " +
                  "takes up to 8 levels of schemas, so flatten it");
    for (const auto& child : *v) todo.emplace_back(&child, depth + 1);
  }
}

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

// Compiles a parsed schema, after check_limits; a schema outside the subset, over the
// limits, or one that admits nothing, is an error.
inline json_node from_json(const nlohmann::ordered_json& schema, const schema_limits& lim = {}) {
  check_limits(schema, lim);
  return detail::compile(schema, "$");
}

// Compiles schema text; its nesting is checked before it is parsed.
inline json_node from_text(std::string_view text, const schema_limits& lim = {}) {
  if (const std::size_t depth = json_nesting_depth(text, lim.max_depth); depth > lim.max_depth)
    throw error("json schema: nested more than " + std::to_string(lim.max_depth) + " arrays and objects deep; tlm takes " +
                "up to 8 levels of schemas, so flatten it");
  nlohmann::ordered_json s;
  try {
    s = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw error(std::string("json schema: not valid JSON: ") + e.what());
  }
  return from_json(s, lim);
}

}  // namespace tlm::json_schema
