// Wrap policies: which top-level layers become FSDP units.
#include <set>

#include "fsdp/fsdp.h"
#include "tensor/error.h"

namespace fsdp {

std::vector<UnitSpec> apply_wrap_policy(Model& model, const FsdpOptions& options) {
  std::vector<UnitSpec> units(1);
  units[0].name = "root";
  std::set<std::string> wanted(options.wrap_modules.begin(), options.wrap_modules.end());
  for (Layer* layer : model.layers()) {
    bool wrap = false;
    switch (options.wrap_policy) {
      case WrapPolicy::size_based:
        // PyTorch's size_based_auto_wrap_policy applied to the top-level layers: a layer with at
        // least min_num_params parameters becomes its own unit.
        wrap = layer->num_params() > 0 && layer->num_params() >= options.min_num_params;
        break;
      case WrapPolicy::transformer_layer: wrap = layer->type() == "TransformerBlock"; break;
      case WrapPolicy::manual: wrap = wanted.erase(layer->name()) > 0; break;
    }
    if (wrap) {
      units.push_back({layer->name(), {layer}});
    } else {
      units[0].layers.push_back(layer);
    }
  }
  if (!wanted.empty()) {
    std::string names;
    for (Layer* layer : model.layers())
      if (layer->num_params() > 0) names += (names.empty() ? "" : ", ") + layer->name();
    throw Error("fsdp.auto_wrap.modules: no top-level module '" + *wanted.begin() +
                "' in this model (modules with parameters: " + names + ")");
  }
  return units;
}

}  // namespace fsdp
