"""The double binary tree over the nodes of a rail, as NCCL builds it (pure functions, no MPI).

Terms. There are `nnodes` nodes, named 0..nnodes-1. A *tree* gives every node a *parent* (-1 for the
*root*) and at most two *children*, listed in a fixed order (the order the reduction combines them in).
An *interior* node has children; a *leaf* has none.

Tree 0 (NCCL's `ncclGetBtree`) is an in-order binary tree on the node numbers. Let `low(r)` be the
lowest set bit of r. Node r > 0 sits at height log2(low(r)): odd nodes are the leaves, and the children
of r are r - low(r)/2 and r + low(r)/2 (the latter, when past the end, replaced by r + low(r)/4,
r + low(r)/8, ... until one exists). Its parent is the node at the next height that covers it,
(r - low(r)) | 2·low(r), or r - low(r) when that is past the end. Node 0 is the root, above the rest:
its one child is the largest power of two below nnodes.

Tree 1 (NCCL's `ncclGetDtree`) is tree 0 renamed so that its interior nodes are tree 0's leaves:
the mirror r -> nnodes-1-r when nnodes is even, the shift r -> r+1 (mod nnodes) when it is odd.
Its root is nnodes-1 (even) or 1 (odd). Each node is then interior in at most one of the two trees,
except node 0 for odd nnodes >= 3, which is tree 0's root and interior in tree 1: the two trees
together let every node send and receive about one share of the data in each direction.

Rooted trees (for reduce and broadcast to `root`): both trees must end at `root`. Number the nodes
from the root, x = (r - root) mod nnodes; tree 0 is tree 0 over x; tree 1 is tree 1 over x with the
labels 0 and tree 1's root swapped, so that x = 0 is its root. The root is then the only node interior
in both. With root = 0, rooted tree 0 is tree 0.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = ["Node", "TREES", "tree_root", "parent_children", "rooted_parent_children", "tree", "rooted_tree"]

TREES = (0, 1)


class Node(NamedTuple):
    parent: int  # -1 for the root
    children: tuple[int, ...]  # 0, 1 or 2 nodes, in combine order


def _btree(rank: int, nnodes: int) -> Node:
    """Tree 0 (NCCL's ncclGetBtree) at node `rank`."""
    low = 1
    while low < nnodes and not low & rank:
        low <<= 1
    if rank == 0:  # low is now the first power of two >= nnodes
        return Node(-1, (low >> 1,) if nnodes > 1 else ())
    parent = (rank ^ low) | (low << 1)
    if parent >= nnodes:
        parent = rank ^ low
    half = low >> 1
    if half == 0:
        return Node(parent, ())
    right = half
    while right and rank + right >= nnodes:
        right >>= 1
    return Node(parent, (rank - half,) + ((rank + right,) if right else ()))


def _check(nnodes: int, which: int, *nodes: int) -> None:
    if nnodes < 1:
        raise ValueError(f"nnodes must be >= 1, got {nnodes}")
    if which not in TREES:
        raise ValueError(f"which must be 0 or 1, got {which}")
    for r in nodes:
        if not 0 <= r < nnodes:
            raise ValueError(f"node {r} is out of range for {nnodes} nodes")


def tree_root(nnodes: int, which: int) -> int:
    """The root of tree `which` over nnodes nodes (NCCL's ncclGetDtreeRoots)."""
    _check(nnodes, which)
    if which == 0:
        return 0
    return 1 if nnodes % 2 == 1 and nnodes > 1 else nnodes - 1


def _to_tree1_label(rank: int, nnodes: int) -> int:
    """The tree-0 label that node `rank` plays in tree 1 (an involution for the mirror, not the shift)."""
    return nnodes - 1 - rank if nnodes % 2 == 0 else (rank - 1) % nnodes


def _from_tree1_label(label: int, nnodes: int) -> int:
    return nnodes - 1 - label if nnodes % 2 == 0 else (label + 1) % nnodes


def _rename(node: Node, rename) -> Node:
    return Node(-1 if node.parent < 0 else rename(node.parent), tuple(rename(c) for c in node.children))


@functools.cache
def parent_children(rank: int, nnodes: int, which: int) -> Node:
    """(parent or -1, children) of node `rank` in tree `which` (0 or 1) of the double binary tree."""
    _check(nnodes, which, rank)
    if which == 0:
        return _btree(rank, nnodes)
    return _rename(_btree(_to_tree1_label(rank, nnodes), nnodes), lambda label: _from_tree1_label(label, nnodes))


@functools.cache
def rooted_parent_children(rank: int, nnodes: int, which: int, root: int) -> Node:
    """(parent or -1, children) of node `rank` in tree `which` rooted at `root` (see the module notes)."""
    _check(nnodes, which, rank, root)
    natural_root = tree_root(nnodes, which)

    def relabel(r: int) -> int:  # node -> x, swapping 0 and the natural root (a no-op for tree 0)
        x = (r - root) % nnodes
        return natural_root if x == 0 else 0 if x == natural_root else x

    def unlabel(x: int) -> int:
        x = natural_root if x == 0 else 0 if x == natural_root else x
        return (x + root) % nnodes

    return _rename(parent_children(relabel(rank), nnodes, which), unlabel)


def tree(nnodes: int, which: int) -> list[Node]:
    """Tree `which` as a list: entry r is node r's Node."""
    return [parent_children(r, nnodes, which) for r in range(nnodes)]


def rooted_tree(nnodes: int, which: int, root: int) -> list[Node]:
    """Tree `which` rooted at `root`, as a list: entry r is node r's Node."""
    return [rooted_parent_children(r, nnodes, which, root) for r in range(nnodes)]
