#include "dsv41/config/model_config.h"

namespace dsv41 {

std::vector<std::string> validate_config(const ModelConfig& c) {
  std::vector<std::string> p;
  if (c.hidden_size <= 0) p.push_back("hidden_size must be positive");
  return p;
}

}  // namespace dsv41
