"""LMDB's pages read by Python: a damaged page is an error here, never LMDB's abort.

LMDB trusts its pages. A leaf page whose type byte is damaged, or a page of zeros where
a leaf was (a file truncated and read anyway), makes ``mdb_cursor_next`` fail an
assertion and abort the process (SIGABRT) as a cursor steps onto it; a node whose data
size is damaged makes it copy from past the map's end. So before a journal is scanned
with LMDB's cursors, ``check_tree`` walks the tree of each table by plain reads: every
page it reaches must say what its parent says it is (a branch or a leaf at the right
depth, an overflow page where a node points), under its own page number, with node
offsets and sizes inside the page. The walk reads each branch page and each leaf page
once (about a microsecond a record, in Python).

``items`` reads a table's records the same way, without LMDB at all: the tools
(``zq journal verify / export / repair``) read a damaged journal through it, stepping
over the pages that fail and naming the bookmarks they held.

The page layout is LMDB 0.9's (mdb.c): a 16-byte header (pgno u64, pad u16, flags u16,
lower u16 / upper u16, or the overflow page count u32), then ``(lower - 16) / 2`` node
offsets (u16); a node is lo u16, hi u16, flags u16, key size u16, the key, the data: a
branch node's child is ``lo | hi << 16 | flags << 32``, a leaf node's data size
``lo | hi << 16`` (F_BIGDATA: the data is on overflow pages, the node holds their page
number). A named table is a node of the main table whose data is its MDB_db record.

A read transaction is held while the pages are read: the writer of a live journal
then reuses none of the pages of that snapshot, and the meta page read is the one of
that transaction.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2, P_SUBP = 0x01, 0x02, 0x04, 0x08, 0x20, 0x40
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
HEADER = 16
NODE = 8
P_INVALID = (1 << 64) - 1
_HEAD = struct.Struct("<QHHHH")
_NODE = struct.Struct("<HHHH")
_DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
DEPTH_MAX = 32


@dataclass
class Table:
    name: str
    root: int
    depth: int
    entries: int


@dataclass
class BadPage:
    """A page that is not what its parent says: the keys it should hold lie between
    ``low`` (its parent's key for it; None: from the start) and ``high`` (the next
    key; None: to the end)."""

    pgno: int
    why: str
    low: bytes | None
    high: bytes | None


@dataclass
class Tree:
    table: Table
    bad: list[BadPage] = field(default_factory=list)
    leaves: int = 0


class PageFile:
    """``data.mdb``'s pages, read with ``os.pread`` (the file's size is known to cover
    every page in use: zq.journal.integrity.read_meta checked it)."""

    def __init__(self, path: str, psize: int, last_pg: int, main_root: int, main_depth: int) -> None:
        self.fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY)
        self.psize, self.last_pg = psize, last_pg
        self.main = Table("main", main_root, main_depth, 0)

    def close(self) -> None:
        os.close(self.fd)

    def page(self, pgno: int, count: int = 1) -> bytes:
        if pgno > self.last_pg or pgno + count - 1 > self.last_pg:
            raise ValueError(f"page {pgno} is past the last page {self.last_pg}")
        data = os.pread(self.fd, self.psize * count, pgno * self.psize)
        if len(data) < self.psize * count:
            raise ValueError(f"page {pgno} is past the file's end")
        return data

    # ------------------------------------------------------------ one page

    def nodes(self, pg: bytes, pgno: int, want: int, deep: bool = True) -> list[tuple[int, int, bytes, int]]:
        """A branch or leaf page's nodes, checked: (flags, lo|hi, key, data offset).
        Not ``deep`` (a leaf, for a walk before LMDB reads it): its header and that its
        node offsets lie inside it, no node read."""
        own, _, flags, lower, upper = _HEAD.unpack_from(pg, 0)
        if own != pgno:
            raise ValueError(f"page {pgno} says it is page {own}")
        if flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2 | P_SUBP) != want:
            kind = "branch" if want == P_BRANCH else "leaf"
            raise ValueError(f"page {pgno} should be a {kind} page, its type is {flags:#x}")
        psize = self.psize
        if not HEADER <= lower <= upper <= psize or (lower - HEADER) % 2:
            raise ValueError(f"page {pgno} has a damaged header (lower {lower}, upper {upper})")
        n = (lower - HEADER) >> 1
        if want == P_BRANCH:
            return self.branch_nodes(pg, pgno, n, upper)
        if not deep:
            ptrs = struct.unpack_from(f"<{n}H", pg, HEADER)
            if n and (min(ptrs) < upper or max(ptrs) > psize - NODE):
                raise ValueError(f"page {pgno}: a node lies outside the page")
            return []
        out = []
        for i in range(n):
            ptr = int.from_bytes(pg[HEADER + 2 * i : HEADER + 2 * i + 2], "little")
            if not upper <= ptr <= psize - NODE:
                raise ValueError(f"page {pgno}: node {i} lies outside the page")
            lo, hi, nflags, ksize = _NODE.unpack_from(pg, ptr)
            kstart = ptr + NODE
            if kstart + ksize > psize:
                raise ValueError(f"page {pgno}: node {i}'s key runs past the page")
            dsize = lo | hi << 16
            if want == P_LEAF:
                room = 8 if nflags & F_BIGDATA else dsize
                if kstart + ksize + room > psize:
                    raise ValueError(f"page {pgno}: node {i}'s data runs past the page")
            out.append((nflags, dsize, pg[kstart : kstart + ksize], kstart + ksize))
        return out

    def branch_nodes(self, pg: bytes, pgno: int, n: int, upper: int) -> list[tuple[int, int, bytes, int]]:
        """A branch page's children: (high 16 bits, low 32 bits of the child's page
        number, key, 0); a node that cannot be read is (-1, 0, b"", 0) and its child's
        keys are named by the walk between its neighbours'."""
        out = []
        for i in range(n):
            ptr = int.from_bytes(pg[HEADER + 2 * i : HEADER + 2 * i + 2], "little")
            if not upper <= ptr <= self.psize - NODE:
                out.append((-1, 0, b"", 0))
                continue
            lo, hi, nflags, ksize = _NODE.unpack_from(pg, ptr)
            if ptr + NODE + ksize > self.psize:
                out.append((-1, 0, b"", 0))
                continue
            out.append((nflags, lo | hi << 16, pg[ptr + NODE : ptr + NODE + ksize], 0))
        return out

    def value(self, pg: bytes, pgno: int, nflags: int, dsize: int, at: int) -> bytes:
        if not nflags & F_BIGDATA:
            return pg[at : at + dsize]
        over = int.from_bytes(pg[at : at + 8], "little")
        first = self.page(over)
        own, _, flags, pages = struct.unpack_from("<QHHI", first, 0)
        if own != over or not flags & P_OVERFLOW:
            raise ValueError(f"overflow page {over} (of a node on page {pgno}) is not one")
        if HEADER + dsize > pages * self.psize:
            raise ValueError(f"a node on page {pgno} claims {dsize} bytes, more than its {pages} overflow pages")
        data = first if pages == 1 else self.page(over, pages)
        return data[HEADER : HEADER + dsize]

    # ------------------------------------------------------------ tables

    def table(self, name: bytes) -> Table | None:
        """A named table's MDB_db record, found in the main table."""
        for key, nflags, raw in self.leaf_items(self.main):
            if key == name:
                if not nflags & F_SUBDATA or len(raw) < _DB.size:
                    raise ValueError(f"the main table's entry for {name.decode()} is not a table")
                _, _, depth, _, _, _, entries, root = _DB.unpack_from(raw, 0)
                if root != P_INVALID and (root > self.last_pg or not 1 <= depth <= DEPTH_MAX):
                    raise ValueError(f"table {name.decode()}: root page {root} or depth {depth} is damaged")
                return Table(name.decode(), root, depth, entries)
        return None

    def leaf_items(self, table: Table) -> Iterator[tuple[bytes, int, bytes]]:
        """(key, node flags, data) of a small table (the main one): errors raise."""
        if table.root == P_INVALID:
            return
        stack = [(table.root, 1)]
        while stack:
            pgno, level = stack.pop()
            pg = self.page(pgno)
            if level < table.depth:
                for nflags, child, _, _ in reversed(self.nodes(pg, pgno, P_BRANCH)):
                    if nflags < 0:
                        raise ValueError(f"branch page {pgno} of the {table.name} table has a node that cannot be read")
                    stack.append((child | nflags << 32, level + 1))
            else:
                for nflags, dsize, key, at in self.nodes(pg, pgno, P_LEAF):
                    yield key, nflags, self.value(pg, pgno, nflags, dsize, at)

    def check(self, table: Table, start: bytes = b"", deep: bool = False) -> Tree:
        """Every page of ``table``'s tree that holds keys from ``start`` on is what its
        parent says it is (a leaf's nodes read too when ``deep``); what is not is named
        with the keys it should hold."""
        tree = Tree(table)
        for _ in self.walk(table, tree, read=False, start=start, deep=deep):
            pass
        return tree

    def items(self, table: Table, tree: Tree, start: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) that can be read, in the tree's order (keys from
        ``start`` on); the pages that cannot are added to ``tree.bad``."""
        return self.walk(table, tree, read=True, start=start)

    def walk(self, table: Table, tree: Tree, read: bool, start: bytes = b"",
             deep: bool = True) -> Iterator[tuple[bytes, bytes]]:
        if table.root == P_INVALID:
            return
        # (pgno, level, low key, high key): the keys a page holds lie in [low, high)
        stack: list[tuple[int, int, bytes | None, bytes | None]] = [(table.root, 1, None, None)]
        while stack:
            pgno, level, low, high = stack.pop()
            if high is not None and high <= start:
                continue
            try:
                pg = self.page(pgno)
                want = P_BRANCH if level < table.depth else P_LEAF
                nodes = self.nodes(pg, pgno, want, deep=read or deep or want == P_BRANCH)
            except ValueError as exc:
                tree.bad.append(BadPage(pgno, str(exc), low, high))
                continue
            if want == P_BRANCH:
                # Child i holds the keys from its own key (the first: from the parent's low)
                # to the next readable node's key; an unreadable node's, from the last
                # readable key before it.
                after: list[bytes | None] = [high] * len(nodes)
                nxt = high
                for i in range(len(nodes) - 1, -1, -1):
                    after[i] = nxt
                    if nodes[i][0] >= 0:
                        nxt = nodes[i][2]
                children = []
                before = low
                for i, (nflags, child, key, _) in enumerate(nodes):
                    if nflags < 0:
                        tree.bad.append(BadPage(pgno, f"branch page {pgno}: node {i} cannot be read", before, after[i]))
                        continue
                    lo_key = low if i == 0 else key
                    children.append((child | nflags << 32, level + 1, lo_key, after[i]))
                    before = lo_key
                stack.extend(reversed(children))
                continue
            tree.leaves += 1
            for nflags, dsize, key, at in nodes:
                if not read:
                    if nflags & F_BIGDATA:  # the overflow page's header, and that the size fits it
                        try:
                            self.value(pg, pgno, nflags, dsize, at)
                        except ValueError as exc:
                            tree.bad.append(BadPage(pgno, str(exc), key, key + b"\0"))
                    continue
                if key < start:
                    continue
                try:
                    value = self.value(pg, pgno, nflags, dsize, at)
                except ValueError as exc:
                    tree.bad.append(BadPage(pgno, str(exc), key, key + b"\0"))
                    continue
                yield key, value


def open_pages(path: str, main_root: int, main_depth: int) -> PageFile:
    """The page reader for ``path``'s journal at the meta page whose main table is
    rooted at ``main_root`` (the caller's read transaction's)."""
    from zq.journal.integrity import read_meta

    meta = read_meta(path)
    if meta is None:
        raise ValueError("no journal file")
    return PageFile(path, meta.psize, meta.last_pg, main_root, main_depth)


class Snapshot:
    """The page reader at a read transaction's snapshot (``with Snapshot(env, path) as
    pages``): the transaction is held while the pages are read."""

    def __init__(self, env, path: str) -> None:  # type: ignore[no-untyped-def]
        self.env, self.path = env, path
        self.txn = None
        self.pages: PageFile | None = None

    def __enter__(self) -> PageFile:
        from zq.journal.integrity import meta_roots, read_meta

        for _ in range(10):
            txn = self.env.begin()
            meta = read_meta(self.path)
            if meta is None:
                txn.abort()
                raise ValueError("no journal file")
            mine = meta_roots(self.path, meta.psize).get(txn.id())
            if mine is not None:  # (else the writer committed twice since: its meta page is gone; again)
                self.txn = txn
                self.pages = PageFile(self.path, meta.psize, meta.last_pg, *mine)
                return self.pages
            txn.abort()
        raise ValueError("the journal changed under every attempt to read its meta page")

    def __exit__(self, *exc: object) -> None:
        if self.pages is not None:
            self.pages.close()
        if self.txn is not None:
            self.txn.abort()
