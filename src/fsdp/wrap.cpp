// Wrap policies over the module tree: which subtrees become FSDP units, nested as PyTorch's
// _recursive_wrap makes them, and which parameters each unit owns.
#include <set>
#include <unordered_map>

#include "fsdp/fsdp.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

// Parent links, depths and each parameter's home: the innermost module whose subtree holds
// every module that owns or uses it (a tied weight's home is above all its users).
class TreeIndex {
 public:
  explicit TreeIndex(Model& model) {
    index(model, nullptr, 0);
    for (Module* m : preorder_) {
      for (auto& p : m->own_params()) settle(p.get(), m);
      for (Param* p : m->used_params()) settle(p, m);
    }
  }
  Module* home(const Param* p) const { return home_.at(p); }
  const std::vector<Module*>& preorder() const { return preorder_; }
  Module* parent(const Module* m) const { return parent_.at(m); }

 private:
  void index(Module& m, Module* parent, int depth) {
    parent_[&m] = parent;
    depth_[&m] = depth;
    preorder_.push_back(&m);
    for (Module* c : m.children()) index(*c, &m, depth + 1);
  }
  Module* common_ancestor(Module* a, Module* b) const {
    while (depth_.at(a) > depth_.at(b)) a = parent_.at(a);
    while (depth_.at(b) > depth_.at(a)) b = parent_.at(b);
    while (a != b) a = parent_.at(a), b = parent_.at(b);
    return a;
  }
  void settle(const Param* p, Module* user) {
    auto it = home_.find(p);
    home_[p] = it == home_.end() ? user : common_ancestor(it->second, user);
  }

  std::unordered_map<const Module*, Module*> parent_;
  std::unordered_map<const Module*, int> depth_;
  std::unordered_map<const Param*, Module*> home_;
  std::vector<Module*> preorder_;
};

// PyTorch's _recursive_wrap: children first, then the module itself on the parameters its
// subtree holds that no wrapped descendant took (nonwrapped_numel).
class Wrapper {
 public:
  Wrapper(Model& model, const FsdpOptions& options, const TreeIndex& tree)
      : options_(options), wanted_(options.wrap_modules.begin(), options.wrap_modules.end()) {
    const std::vector<std::string> types = model.block_types();
    block_types_.insert(types.begin(), types.end());
    for (Module* m : tree.preorder())
      for (auto& p : m->own_params()) home_numel_[tree.home(p.get())] += p->numel();
    nonwrapped(model, false);
  }
  bool wrapped(const Module* m) const { return wrapped_.contains(m); }
  const std::set<std::string>& unmatched() const { return wanted_; }

 private:
  int64_t nonwrapped(Module& m, bool inside_leaf) {
    int64_t numel = home_numel_[&m];
    // size_based treats MultiheadAttention as a leaf (FORCE_LEAF_MODULES): its out_proj is
    // never a unit of its own.
    const bool leaf =
        inside_leaf || (options_.wrap_policy == WrapPolicy::size_based && m.type() == "MultiheadAttention");
    for (Module* c : m.children()) {
      const int64_t child = nonwrapped(*c, leaf);
      if (!leaf && wants(*c, child)) {
        wrapped_.insert(c);
      } else {
        numel += child;
      }
    }
    return numel;
  }
  bool wants(Module& m, int64_t numel) {
    // A module whose parameters all belong elsewhere (or that has none) would be an empty unit.
    if (m.is_container() || numel == 0) return false;
    switch (options_.wrap_policy) {
      case WrapPolicy::size_based: return numel >= options_.min_num_params;
      case WrapPolicy::transformer_layer: return block_types_.contains(m.type());
      case WrapPolicy::manual: return wanted_.erase(m.name()) > 0;
    }
    return false;
  }

  const FsdpOptions& options_;
  std::set<std::string> wanted_;
  std::set<std::string> block_types_;
  std::unordered_map<const Module*, int64_t> home_numel_;
  std::set<const Module*> wrapped_;
};

}  // namespace

std::vector<UnitSpec> apply_wrap_policy(Model& model, const FsdpOptions& options) {
  const TreeIndex tree(model);
  const Wrapper wrapper(model, options, tree);
  if (!wrapper.unmatched().empty()) {
    std::string names;
    for (Module* m : tree.preorder())
      if (m != &model && !m->is_container() && m->num_params() > 0) names += (names.empty() ? "" : ", ") + m->name();
    throw Error("fsdp.auto_wrap.modules: no module '" + *wrapper.unmatched().begin() +
                "' with parameters of its own in this model (modules with parameters: " + names + ")");
  }
  // Units in pre-order (an outer unit before the units nested in it), the root first.
  std::vector<UnitSpec> units(1);
  units[0].name = "root";
  units[0].module = &model;
  std::unordered_map<const Module*, size_t> unit_of;
  for (Module* m : tree.preorder()) {
    if (m == &model) {
      unit_of[m] = 0;
    } else if (wrapper.wrapped(m)) {
      unit_of[m] = units.size();
      units.push_back({m->name(), m, {}});
    } else {
      unit_of[m] = unit_of.at(tree.parent(m));
    }
  }
  // named_parameters() order within each unit: a parameter sits where it is registered.
  for (Param* p : model.params()) units[unit_of.at(tree.home(p))].params.push_back(p);
  return units;
}

}  // namespace fsdp
