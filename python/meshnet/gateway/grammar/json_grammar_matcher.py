"""Test-only: a small GBNF recognizer, so json_grammar's output is checked without llama.cpp.

`parse` reads grammar text the way llama.cpp's parser (src/llama-grammar.cpp at the pinned
commit) does, and refuses what it refuses: a rule ends at a newline outside parentheses (a `|`
continues it); escapes in literals and classes are only \\x.. \\u.... \\U........ \\t \\r \\n \\\\
\\" \\[ \\] \\-; `-` inside a class makes a range unless `]` follows; every referenced rule must be
defined; a repetition may not make more than 2000 rules (its count times the rules the repeated
group itself made, as llama.cpp counts them); no rule may reach itself before consuming a
character (left recursion). Tokens (`<...>`) are not supported.

`Grammar.matches(text)` says whether all of `text` matches `root`: a memoised search over sets
of end positions, fine for the short documents of the tests. `Grammar.leftmost_visits()`: the
work llama.cpp's left-recursion check does on the grammar (it does not memoise).
"""

from __future__ import annotations

from typing import Optional

MAX_REPETITION_THRESHOLD = 2000  # llama-grammar.cpp
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
_HEX_SIZES = {"x": 2, "u": 4, "U": 8}

# Nodes: ("chars", negated, ((low, high), ...)), ("any",), ("ref", name), ("seq", (nodes)),
# ("alt", (seqs)), ("rep", node, low, high or None).


class GrammarError(ValueError):
    pass


def _word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0
        self.rules: dict[str, tuple] = {}
        self.referenced: set[str] = set()
        self.symbols: set[str] = set()  # llama.cpp's symbol_ids: names seen, then generated ones
        self.generated = 0

    def peek(self, k: int = 0) -> str:
        return self.s[self.i + k] if self.i + k < len(self.s) else ""

    def space(self, newline_ok: bool) -> None:
        while self.peek() in (" ", "\t", "#") or (newline_ok and self.peek() in ("\r", "\n")):
            if self.peek() == "#":
                while self.peek() and self.peek() not in "\r\n":
                    self.i += 1
            else:
                self.i += 1

    def name(self) -> str:
        start = self.i
        while self.peek() and _word(self.peek()):
            self.i += 1
        if start == self.i:
            raise GrammarError(f"expecting name at {self.s[start:start + 20]!r}")
        name = self.s[start:self.i]
        self.symbols.add(name)
        return name

    def char(self) -> int:
        c = self.peek()
        if not c:
            raise GrammarError("unexpected end of input")
        if c != "\\":
            self.i += 1
            return ord(c)
        kind = self.peek(1)
        if kind in _HEX_SIZES:
            digits = self.s[self.i + 2:self.i + 2 + _HEX_SIZES[kind]]
            if len(digits) != _HEX_SIZES[kind] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise GrammarError(f"expecting {_HEX_SIZES[kind]} hex chars at {self.s[self.i:self.i + 12]!r}")
            self.i += 2 + len(digits)
            return int(digits, 16)
        if kind not in _ESCAPES:
            raise GrammarError(f"unknown escape at {self.s[self.i:self.i + 8]!r}")
        self.i += 2
        return ord(_ESCAPES[kind])

    def rule(self) -> None:
        name = self.name()
        self.space(False)
        if self.s[self.i:self.i + 3] != "::=":
            raise GrammarError(f"expecting ::= at {self.s[self.i:self.i + 20]!r}")
        self.i += 3
        self.space(True)
        self.rules[name] = self.alternates(False)
        if self.peek() == "\r":
            self.i += 2 if self.peek(1) == "\n" else 1
        elif self.peek() == "\n":
            self.i += 1
        elif self.peek():
            raise GrammarError(f"expecting newline or end at {self.s[self.i:self.i + 20]!r}")
        self.space(True)

    def alternates(self, nested: bool) -> tuple:
        seqs = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            seqs.append(self.sequence(nested))
        return ("alt", tuple(seqs))

    def count(self) -> int:
        return len(self.symbols) + self.generated

    def sequence(self, nested: bool) -> tuple:
        items: list[tuple] = []
        previous = 1  # llama.cpp's n_prev_rules: rules the last symbol made
        while self.peek():
            c = self.peek()
            if c == '"':
                self.i += 1
                chars = []
                while self.peek() != '"':
                    code = self.char()
                    chars.append(("chars", False, ((code, code),)))
                self.i += 1
                items.append(("seq", tuple(chars)))
                previous = 1
            elif c == "[":
                self.i += 1
                negated = self.peek() == "^"
                self.i += negated
                ranges = []
                while self.peek() != "]":
                    low = high = self.char()
                    if self.peek() == "-" and self.peek(1) != "]":
                        if not self.peek(1):
                            raise GrammarError("unexpected end of input")
                        self.i += 1
                        high = self.char()
                    ranges.append((low, high))
                self.i += 1
                items.append(("chars", negated, tuple(ranges)))
                previous = 1
            elif _word(c):
                name = self.name()
                self.referenced.add(name)
                items.append(("ref", name))
                previous = 1
            elif c == "(":
                self.i += 1
                self.space(True)
                before = self.count()
                self.generated += 1
                items.append(self.alternates(True))
                previous = max(1, self.count() - before)
                if self.peek() != ")":
                    raise GrammarError(f"expecting ')' at {self.s[self.i:self.i + 20]!r}")
                self.i += 1
            elif c == ".":
                self.i += 1
                items.append(("any",))
                previous = 1
            elif c in "*+?{":
                if not items:
                    raise GrammarError("expecting preceding item to */+/?/{")
                low, high = self.repetition()
                total = high if high not in (None, 0) else (low if low > 0 else 1)
                if previous * total > MAX_REPETITION_THRESHOLD:
                    raise GrammarError("number of rules that are going to be repeated exceeds sane defaults")
                self.generated += 1 if high is None else high - low
                previous *= total
                items[-1] = ("rep", items[-1], low, high)
            else:
                break
            self.space(nested)
        return ("seq", tuple(items))

    def repetition(self) -> tuple[int, Optional[int]]:
        c = self.peek()
        self.i += 1
        if c != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        self.space(False)
        low = self.integer()
        self.space(False)
        if self.peek() == "}":
            high: Optional[int] = low
        elif self.peek() == ",":
            self.i += 1
            self.space(False)
            high = self.integer() if self.peek().isdigit() else None
            self.space(False)
            if self.peek() != "}":
                raise GrammarError(f"expecting '}}' at {self.s[self.i:self.i + 20]!r}")
        else:
            raise GrammarError(f"expecting ',' at {self.s[self.i:self.i + 20]!r}")
        self.i += 1
        if low > MAX_REPETITION_THRESHOLD:
            raise GrammarError("number of repetitions exceeds sane defaults")
        if high is not None and high > MAX_REPETITION_THRESHOLD:
            high = None
        return low, high

    def integer(self) -> int:
        start = self.i
        while self.peek().isdigit() and self.peek().isascii():
            self.i += 1
        if start == self.i:
            raise GrammarError(f"expecting integer at {self.s[start:start + 20]!r}")
        return int(self.s[start:self.i])


class Grammar:
    def __init__(self, rules: dict[str, tuple], leftmost: dict[str, list[str]]) -> None:
        self.rules, self._leftmost = rules, leftmost

    def leftmost_visits(self) -> int:
        """The most rule visits llama.cpp's left-recursion check makes from one rule: it follows
        every leftmost reference, unmemoised (counted here with a memo; groups not counted)."""
        visits: dict[str, int] = {}
        for start in self.rules:
            stack = [start]
            while stack:
                name = stack[-1]
                todo = [ref for ref in self._leftmost[name] if ref not in visits]
                if todo:
                    stack.extend(todo)
                    continue
                visits[name] = 1 + sum(visits[ref] for ref in self._leftmost[name])
                stack.pop()
        return max(visits.values())

    def matches(self, text: str, rule: str = "root") -> bool:
        return len(text) in _Search(self.rules, text).ends(self.rules[rule], 0)


def parse(text: str) -> Grammar:
    parser = _Parser(text)
    parser.space(True)
    while parser.peek():
        parser.rule()
    undefined = parser.referenced - set(parser.rules)
    if undefined:
        raise GrammarError(f"undefined rules {sorted(undefined)}")
    if "root" not in parser.rules:
        raise GrammarError("no root rule")
    return Grammar(parser.rules, _leftmost_references(parser.rules))


def _leftmost_references(rules: dict[str, tuple]) -> dict[str, list[str]]:
    """Each rule's references that can come first (past ones that can match nothing), as many
    times as they occur; refuses left recursion as llama_grammar_init does."""
    nullable = dict.fromkeys(rules, False)

    def can_be_empty(node: tuple) -> bool:
        kind = node[0]
        if kind == "ref":
            return nullable[node[1]]
        if kind == "seq":
            return all(can_be_empty(item) for item in node[1])
        if kind == "alt":
            return any(can_be_empty(seq) for seq in node[1])
        if kind == "rep":
            return node[2] == 0 or can_be_empty(node[1])
        return False

    changed = True
    while changed:
        changed = False
        for name, body in rules.items():
            if not nullable[name] and can_be_empty(body):
                nullable[name] = changed = True

    def leftmost(node: tuple, out: list[str]) -> None:
        kind = node[0]
        if kind == "ref":
            out.append(node[1])
        elif kind == "seq":
            for item in node[1]:
                leftmost(item, out)
                if not can_be_empty(item):
                    break
        elif kind == "alt":
            for seq in node[1]:
                leftmost(seq, out)
        elif kind == "rep":
            leftmost(node[1], out)

    edges: dict[str, list[str]] = {}
    for name, body in rules.items():
        edges[name] = []
        leftmost(body, edges[name])
    done: set[str] = set()
    for start in rules:
        path, on_path = [(start, iter(edges[start]))], {start}
        while path and start not in done:
            node, targets = path[-1]
            target = next(targets, None)
            if target is None:
                done.add(node)
                on_path.discard(node)
                path.pop()
            elif target in on_path:
                raise GrammarError(f"left recursion through {target!r}")
            elif target not in done:
                on_path.add(target)
                path.append((target, iter(edges[target])))
    return edges


class _Search:
    """End positions of each node from each start, memoised."""

    def __init__(self, rules: dict[str, tuple], text: str) -> None:
        self.rules, self.text = rules, text
        self.memo: dict[tuple[int, int], frozenset] = {}

    def ends(self, node: tuple, at: int) -> frozenset:
        key = (id(node), at)
        if key not in self.memo:
            self.memo[key] = frozenset(self._ends(node, at))
        return self.memo[key]

    def _many(self, node: tuple, starts: set[int]) -> set[int]:
        out: set[int] = set()
        for at in starts:
            out |= self.ends(node, at)
        return out

    def _ends(self, node: tuple, at: int) -> set[int]:
        kind = node[0]
        if kind in ("chars", "any"):
            if at >= len(self.text):
                return set()
            code = ord(self.text[at])
            hit = kind == "any" or (any(low <= code <= high for low, high in node[2]) != node[1])
            return {at + 1} if hit else set()
        if kind == "ref":
            return set(self.ends(self.rules[node[1]], at))
        if kind == "seq":
            positions = {at}
            for item in node[1]:
                positions = self._many(item, positions)
                if not positions:
                    break
            return positions
        if kind == "alt":
            return set().union(*(self.ends(seq, at) for seq in node[1]))
        _, item, low, high = node
        out: set[int] = set()
        frontier, count = {at}, 0
        while frontier:
            if count >= low:
                frontier -= out  # reached again with fewer repetitions left: nothing new
                out |= frontier
            if high is not None and count == high:
                break
            frontier = self._many(item, frontier)
            count += 1
        return out
