// OpenAI error objects: {"error": {"message", "type", "param", "code"}} with their HTTP status.
#pragma once
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "dsv41/serve/http.h"

namespace dsv41::serve {

using Json = nlohmann::ordered_json;

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)), code(std::move(code)) {}
  int status;
  std::string type, param, code;
  int retry_after_s = 0;  // 429/503: the Retry-After to send (0: the server's default)
};

inline ApiError bad_request(std::string message, std::string param = {}, std::string code = {}) {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}

Json error_json(int status, const std::string& message, const std::string& type, const std::string& param,
                const std::string& code);
HttpResponse error_response(const ApiError& e, int retry_after_s);

}  // namespace dsv41::serve
