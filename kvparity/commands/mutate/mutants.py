"""The mutants: every single-point mutation cosmic-ray's core operators can make to the reference
engine's decision modules, a seeded sample of them, and each one materialised as a temporary copy of
reference_engine/ with the one file changed (the working tree is never mutated in place).

Why cosmic-ray (8.7) and not mutmut (3): cosmic-ray's operators are plain objects over parso syntax
trees with a public `mutate_code(source, operator, occurrence)`, so one mutant is one source string we
can put anywhere; mutmut 3 rewrites whole packages into trampolined copies and runs pytest itself,
with no supported way to export one mutant's source for a suite that is not a pytest run. We use only
cosmic-ray's operators, not its session database or its runner.
"""

from __future__ import annotations

import difflib
import random
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from attrs import frozen

import reference_engine

# The decision code: what decides which KV is reused, kept, evicted, scheduled, drafted and accepted.
# Not the model's arithmetic (model.py, baseline.py), not training, not the fault zoo (faults.py).
DECISION_MODULES = ("engine", "prefix_cache", "block_pool", "scheduler", "sequence", "drafters")

# Operators left out: VariableReplacer and VariableInserter draw their replacement at random each time
# they are applied (the same occurrence is a different mutant on every run); NoOp mutates nothing.
EXCLUDED_OPERATORS = ("core/VariableReplacer", "core/VariableInserter", "core/NoOp")

# How an operator's name maps to the kind of mutation the score is broken down by.
KINDS = (("core/ReplaceBinaryOperator", "binary-operator"), ("core/ReplaceComparisonOperator", "comparison"),
         ("core/ReplaceUnaryOperator", "unary-operator"), ("core/AddNot", "boolean"),
         ("core/ReplaceTrueWithFalse", "boolean"), ("core/ReplaceFalseWithTrue", "boolean"),
         ("core/ReplaceAndWithOr", "boolean"), ("core/ReplaceOrWithAnd", "boolean"),
         ("core/ReplaceBreakWithContinue", "break-continue"), ("core/ReplaceContinueWithBreak", "break-continue"),
         ("core/ExceptionReplacer", "exception"), ("core/NumberReplacer", "number"),
         ("core/RemoveDecorator", "decorator"), ("core/ZeroIterationForLoop", "zero-iteration-loop"))


def kind_of(operator: str) -> str:
    return next((kind for prefix, kind in KINDS if operator.startswith(prefix)), "other")


@frozen
class Mutant:
    """One mutation: `occurrence` counts the places `operator` can mutate `module`, in cosmic-ray's walk
    order, so (module, operator, occurrence) names the same mutant for the same source."""

    module: str
    operator: str
    occurrence: int
    line: int

    @property
    def name(self) -> str:
        return f"{self.module}:{self.line}:{self.operator.removeprefix('core/')}#{self.occurrence}"

    @property
    def kind(self) -> str:
        return kind_of(self.operator)

    def to_json(self) -> dict:
        return {"module": self.module, "operator": self.operator, "occurrence": self.occurrence,
                "line": self.line, "kind": self.kind, "name": self.name}


def source_root() -> Path:
    """The reference_engine package this process imports (the worktree's, with PYTHONPATH set)."""
    return Path(reference_engine.__file__).parent


def operator_names() -> list[str]:
    from cosmic_ray.plugins import operator_names as all_names

    return sorted(n for n in all_names() if n.startswith("core/") and n not in EXCLUDED_OPERATORS)


def _operator(name: str):
    from cosmic_ray.plugins import get_operator

    return get_operator(name)()


def positions(source: str, names: Sequence[str]) -> dict[str, list[tuple[int, tuple[int, int]]]]:
    """For each operator of `names`, each place it can mutate `source` outside type annotations:
    (occurrence, (line, column)), the occurrence as cosmic-ray counts it (annotations included), so
    `mutate_code` applies it. One parse and one walk for all operators (the walk changes nothing)."""
    from cosmic_ray.ast import Visitor, get_ast

    ops = {name: _operator(name) for name in names}
    found: dict[str, list[tuple[int, int]]] = {name: [] for name in names}

    class Count(Visitor):
        def visit(self, node):
            for name, op in ops.items():
                found[name].extend(start for start, _ in op.mutation_positions(node))
            return node

    tree = get_ast(source)
    Count().walk(tree)
    spans = annotation_spans(tree) if "from __future__ import annotations" in source else []
    return {name: [(i, p) for i, p in enumerate(found[name]) if not any(a <= p < b for a, b in spans)]
            for name in names}


def annotation_spans(tree) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the type annotations are. Under `from __future__ import annotations` they are never
    evaluated, so a mutant in one (`int | None` -> `int << None`) is equivalent by construction: left
    out, rather than spending a suite run and a differential search to find that out."""
    from cosmic_ray.ast import ast_nodes

    spans = []
    for node in ast_nodes(tree):
        kids = getattr(node, "children", [])
        if node.type in ("tfpdef", "annassign"):
            ann = kids[2] if node.type == "tfpdef" and len(kids) > 2 else kids[1] if node.type == "annassign" else None
        elif node.type == "funcdef":
            ann = next((kids[i + 1] for i, k in enumerate(kids) if getattr(k, "value", None) == "->"), None)
        else:
            continue
        if ann is not None:
            spans.append((ann.start_pos, ann.end_pos))
    return spans


def enumerate_mutants(modules: Sequence[str] = DECISION_MODULES, root: Path | None = None) -> list[Mutant]:
    """Every mutant of `modules`, in a stable order (module, operator, occurrence)."""
    root = root or source_root()
    names, out = operator_names(), []
    for module in modules:
        found = positions((root / f"{module}.py").read_text(), names)
        for name in names:
            out += [Mutant(module, name, i, line) for i, (line, _) in found[name]]
    return out


def sample(mutants: Sequence[Mutant], n: int | None, seed: int) -> list[Mutant]:
    """`n` mutants drawn without replacement with `random.Random(seed)`, stratified by module (each
    module gets its share of `n` in proportion to its mutants, at least one), taking the modules in
    turn (`interleave`)."""
    if n is None or n >= len(mutants):
        return list(mutants)
    rng = random.Random(seed)
    by_module: dict[str, list[Mutant]] = {}
    for m in mutants:
        by_module.setdefault(m.module, []).append(m)
    shares = {mod: max(1, round(n * len(ms) / len(mutants))) for mod, ms in by_module.items()}
    exact = {mod: n * len(ms) / len(mutants) for mod, ms in by_module.items()}
    while sum(shares.values()) > n:  # rounding can overshoot: take from the largest share
        shares[max(shares, key=shares.get)] -= 1
    while sum(shares.values()) < n:  # ... or fall short: give to the share rounded down the most
        shares[max(shares, key=lambda mod: exact[mod] - shares[mod])] += 1
    picked = {mod: sorted(rng.sample(ms, min(shares[mod], len(ms))), key=lambda m: (m.line, m.operator, m.occurrence))
              for mod, ms in by_module.items()}
    return interleave(list(picked.values()))


def interleave(groups: list[list[Mutant]]) -> list[Mutant]:
    """Round-robin over the modules: a run stopped part-way has still sampled every module alike."""
    out, longest = [], max((len(g) for g in groups), default=0)
    for i in range(longest):
        out += [g[i] for g in groups if i < len(g)]
    return out


def mutated_source(mutant: Mutant, root: Path | None = None) -> str:
    from cosmic_ray.mutating import mutate_code

    source = ((root or source_root()) / f"{mutant.module}.py").read_text()
    code = mutate_code(source, _operator(mutant.operator), mutant.occurrence)
    if code is None:
        raise ValueError(f"{mutant.name}: no such occurrence in this source")
    return code


def diff(mutant: Mutant, root: Path | None = None) -> str:
    """The mutation as a unified diff (only the changed lines and one line of context)."""
    source = ((root or source_root()) / f"{mutant.module}.py").read_text()
    lines = difflib.unified_diff(source.splitlines(), mutated_source(mutant, root).splitlines(),
                                 f"a/reference_engine/{mutant.module}.py", f"b/reference_engine/{mutant.module}.py",
                                 n=1, lineterm="")
    return "\n".join(lines)


def materialise(mutant: Mutant | None, into: Path, root: Path | None = None) -> Path:
    """A copy of reference_engine/ under `into` with `mutant` applied (None: unmutated); returns the
    folder to put first on PYTHONPATH. The checkpoints and training data are linked, not copied."""
    root = root or source_root()
    pkg = into / "reference_engine"
    pkg.mkdir(parents=True)
    for item in root.iterdir():
        if item.suffix == ".py":
            shutil.copy2(item, pkg / item.name)
        elif item.is_dir() and item.name != "__pycache__":
            (pkg / item.name).symlink_to(item.resolve(), target_is_directory=True)
    if mutant is not None:
        (pkg / f"{mutant.module}.py").write_text(mutated_source(mutant, root))
    return into


class MutantTree:
    """A temporary materialised mutant, removed on exit."""

    def __init__(self, mutant: Mutant | None) -> None:
        self.mutant = mutant
        self._tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Path:
        self._tmp = tempfile.TemporaryDirectory(prefix="kvparity-mutant-")
        return materialise(self.mutant, Path(self._tmp.name) / "src")

    def __exit__(self, *exc) -> None:
        assert self._tmp is not None
        self._tmp.cleanup()
