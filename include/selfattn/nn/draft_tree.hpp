#pragma once
/// \file
/// DraftTree: the shape of a tree of draft tokens that speculative decoding verifies in one step
/// (MultiHeadAttention::step_tree), and what the step derives from it: each draft's depth (its position after the
/// cached prefix), the ancestor mask over the prefix and the drafts, and the path to an accepted draft
/// (KVCache::keep_draft_path keeps only that path afterwards).

#include <selfattn/errors.hpp>
#include <selfattn/tensor.hpp>

#include <string>
#include <vector>

namespace selfattn {

/// \brief A tree of k draft tokens in topological order: `parents[i]` is the draft that token i follows, or -1
/// when it follows the last cached token directly (a root). A chain of k drafts is {-1, 0, 1, ..., k - 2}.
///
/// A draft attends to the whole cached prefix, to its ancestors and to itself, and sits at position
/// `prefix + depth` (RoPE): a path root -> leaf sees exactly what k one-token steps along it would.
/// \code
/// //        prefix -> 0 -> 1          two continuations of draft 0, and an alternative first token
/// //                    \-> 2
/// //        prefix -> 3
/// DraftTree tree{{-1, 0, 0, -1}};
/// tree.depths();      // {0, 1, 1, 0}
/// tree.path_to(2);    // {0, 2}
/// \endcode
struct DraftTree {
  std::vector<Index> parents;  ///< parents[i] in [-1, i): the draft token i follows, -1 for the cached prefix

  /// A chain of k drafts, each following the one before: what plain speculative decoding verifies.
  static DraftTree chain(Index k) {
    if (k < 0) detail::throw_invalid("DraftTree::chain", "k", "expected >= 0, got " + std::to_string(k));
    DraftTree tree;
    for (Index i = 0; i < k; ++i) tree.parents.push_back(i - 1);
    return tree;
  }

  /// The number of draft tokens, k.
  Index size() const { return static_cast<Index>(parents.size()); }

  /// Throws std::invalid_argument naming `parents` (and the entry) unless every parents[i] is in [-1, i): a parent
  /// after its child, or a token its own parent, is not a tree in topological order.
  void check(const char* function) const {
    for (Index i = 0; i < size(); ++i) {
      const Index parent = parents[static_cast<std::size_t>(i)];
      if (parent < -1 || parent >= i)
        detail::throw_invalid(function, "parents",
                              "parents[" + std::to_string(i) +
                                  "] must be -1 (the cached prefix) or an earlier draft in [0, " + std::to_string(i) +
                                  "), got " + std::to_string(parent) +
                                  ": the drafts must form a tree listed parents first");
    }
  }

  /// depth[i]: 0 for a root, its parent's depth + 1 otherwise; draft i sits at position prefix + depth[i].
  std::vector<Index> depths() const {
    check("DraftTree::depths");
    std::vector<Index> depth(parents.size(), 0);
    for (std::size_t i = 0; i < parents.size(); ++i)
      if (parents[i] >= 0) depth[i] = depth[static_cast<std::size_t>(parents[i])] + 1;
    return depth;
  }

  /// The drafts from a root down to `node`, root first (what KVCache::keep_draft_path keeps when `node` is the
  /// last accepted draft). Throws std::invalid_argument naming `node` outside [0, k).
  std::vector<Index> path_to(Index node) const {
    check("DraftTree::path_to");
    if (node < 0 || node >= size())
      detail::throw_invalid("DraftTree::path_to", "node",
                            "expected a draft in [0, " + std::to_string(size()) + "), got " + std::to_string(node));
    std::vector<Index> path;
    for (Index i = node; i >= 0; i = parents[static_cast<std::size_t>(i)]) path.insert(path.begin(), i);
    return path;
  }

  /// Whether draft `ancestor` is `node` or one of its ancestors: whether node may attend to it.
  bool sees(Index node, Index ancestor) const {
    for (Index i = node; i >= ancestor; i = parents[static_cast<std::size_t>(i)])
      if (i == ancestor) return true;
    return false;
  }
};

}  // namespace selfattn
