"""One method factory, the engine's public API, the layering rules, and docs/architecture.md.

The worked examples of docs/architecture.md are executed here and checked against closed forms.
Backend-independent (runs in the JAX / PyTorch loop too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import keras
import numpy as np
import pytest

import kerascope as ks
from kerascope.core.engine import Engine
from kerascope.methods import registry
from kerascope.methods.base import FunctionMethod

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kerascope"


@pytest.fixture
def restore_registry():
    saved = dict(registry._REGISTRY)
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)


def _gap_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(3, 3, activation="relu", name="conv"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4, name="head"),
    ])


def _doc_blocks() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _doc_example(defines: str) -> dict:
    """Run the one python block of docs/architecture.md that defines ``defines``; its namespace."""
    blocks = [block for block in _doc_blocks() if re.search(rf"^(class|def) {defines}\b", block, flags=re.M)]
    assert len(blocks) == 1, f"{len(blocks)} blocks define {defines}"
    namespace: dict = {"__name__": f"doc_{defines.lower()}"}
    code = compile(blocks[0], f"docs/architecture.md ({defines})", "exec", dont_inherit=True)  # (no future flags)
    exec(code, namespace)  # noqa: S102 - the documented example, as a newcomer would paste it
    return namespace


# ----------------------------------------------------------------------------- the docs' examples
def test_doc_gradient_cam_example_equals_gradcam_under_global_average_pooling(restore_registry) -> None:
    namespace = _doc_example("MaxGradCAM")
    assert registry.get("maxgradcam") is namespace["MaxGradCAM"]
    model = _gap_model()
    x = np.random.default_rng(0).random((3, 8, 8, 2)).astype(np.float32)
    ours = ks.explain(model, x, "maxgradcam", targets=[0, 1, 3], layer="conv")
    reference = ks.GradCAM(model, layer="conv").explain(x, [0, 1, 3])
    # GAP + Dense: dS/dA is the same at every position, so max over space == mean over space
    np.testing.assert_allclose(ours.attributions, reference.attributions, rtol=1e-5, atol=1e-6)
    assert float(np.abs(ours.attributions).max()) > 0


def test_doc_perturbation_example_equals_the_linear_closed_form(restore_registry) -> None:
    _doc_example("ZeroOneFeature")
    dense = keras.layers.Dense(3, activation="softmax")
    model = keras.Sequential([keras.Input((4,)), dense])
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    dense.set_weights([w, np.array([0.1, -0.2, 0.3], np.float32)])
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    targets = [0, 1, 2, 0, 1]
    explanation = registry.build("zero_one_feature", model, common={"batch_size": 3}).explain(x, targets)
    # logits space (softmax bypassed): the drop of feature i is W[i, t] * x_i exactly
    expected = x * w[:, targets].T
    np.testing.assert_allclose(explanation.attributions, expected, rtol=1e-5, atol=1e-5)


def _tanh_model(seed: int = 0) -> tuple[keras.Model, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w, v = rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(5, 3)).astype(np.float32)
    hidden, head = keras.layers.Dense(5, activation="tanh", use_bias=False), keras.layers.Dense(3, use_bias=False)
    model = keras.Sequential([keras.Input((4,)), hidden, head])
    hidden.set_weights([w])
    head.set_weights([v])
    return model, w, v


def test_doc_gradient_method_example_equals_the_hand_written_gradient(restore_registry) -> None:
    namespace = _doc_example("SquaredGradient")
    assert registry.get("squared_gradient") is namespace["SquaredGradient"]
    model, w, v = _tanh_model()
    x = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    targets = np.array([0, 1, 2, 2, 1, 0])
    ours = ks.explain(model, x, "squared_gradient", targets=targets, batch_size=4).attributions
    # d/dx V[:, t] . tanh(x W) = W (V[:, t] * (1 - tanh(x W)^2)), by hand in float64
    slope = 1 - np.tanh(x.astype(np.float64) @ w) ** 2
    gradient = (slope * v[:, targets].T) @ w.T
    np.testing.assert_allclose(ours, gradient**2, rtol=1e-4, atol=1e-6)


def test_doc_lrp_rule_example_matches_the_w_square_formula() -> None:
    wsquare = _doc_example("WSquare")["WSquare"]
    dense = keras.layers.Dense(3)
    model = keras.Sequential([keras.Input((4,)), dense])
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10 - 0.5
    bias = np.array([0.1, -0.2, 0.3], np.float32)
    dense.set_weights([w, bias])
    x = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
    targets = [0, 2, 1, 0, 2]
    relevance = ks.LRP(model, rules={"Dense": wsquare()}).explain(x, targets).attributions
    scores = (x @ w + bias)[np.arange(5), targets]
    share = (w[:, targets] ** 2 / (w[:, targets] ** 2).sum(0)).T
    np.testing.assert_allclose(relevance, share * scores[:, None], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(relevance.sum(1), scores, rtol=1e-4, atol=1e-5)  # conservation


def test_doc_metric_example_equals_the_linear_closed_form() -> None:
    top_k_drop = _doc_example("top_k_drop")["top_k_drop"]
    dense = keras.layers.Dense(3)
    model = keras.Sequential([keras.Input((5,)), dense])
    rng = np.random.default_rng(3)
    w = rng.normal(size=(5, 3)).astype(np.float32)
    dense.set_weights([w, np.zeros(3, np.float32)])
    x = rng.normal(size=(7, 5)).astype(np.float32)
    targets = rng.integers(0, 3, 7)
    contributions = x * w[:, targets].T  # Gradient x Input of a linear model: the exact contributions
    result = top_k_drop(model, x, contributions, targets, k=2, batch_size=3)
    expected = np.sort(contributions, axis=1)[:, -2:].sum(1)
    np.testing.assert_allclose(result.scores, expected, rtol=1e-4, atol=1e-5)
    assert result.higher_is_better and result.details["k"] == 2


def test_doc_cli_flag_example_is_shared_by_both_sub_commands() -> None:
    namespace = _doc_example("add_seed_flag")
    parser = namespace["parser"]
    for command in ("explain", "batch"):
        assert parser.parse_args([command, "--seed", "3"]).seed == 3
        assert parser.parse_args([command]).seed is None
    assert namespace["with_seed"]({"samples": 8}, 3) == {"samples": 8, "seed": 3}
    assert namespace["with_seed"]({}, None) == {}
    # the pattern the example follows: the real shared flags are added once, by more than one sub-command
    common = (PACKAGE / "cli" / "common.py").read_text()
    assert "add_precision_flag(parser)" in common.split("def add_run_flags", 1)[1].split("\ndef ", 1)[0]
    users = [path.name for path in sorted((PACKAGE / "cli").glob("*.py"))
             if path.name != "common.py" and "add_run_flags(" in path.read_text()]
    assert len(users) >= 2, users


def test_doc_input_kind_example_loads_what_every_method_explains(tmp_path) -> None:
    load_series = _doc_example("load_series")["load_series"]
    rng = np.random.default_rng(4)
    series = rng.normal(size=(3, 6, 2)).astype(np.float32)
    files = []
    for i, sample in enumerate(series):
        files.append(tmp_path / f"s{i}.csv")
        np.savetxt(files[-1], sample, delimiter=",")
    dense = keras.layers.Dense(2)
    model = keras.Sequential([keras.Input((6, 2)), keras.layers.Flatten(), dense])
    w = rng.normal(size=(12, 2)).astype(np.float32)
    dense.set_weights([w, np.zeros(2, np.float32)])
    batch = load_series(files, model)
    np.testing.assert_allclose(batch, series, rtol=1e-6)
    saliency = ks.explain(model, batch, "saliency", targets=[0, 1, 1]).attributions
    np.testing.assert_allclose(saliency, w[:, [0, 1, 1]].T.reshape(3, 6, 2), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="Received"):
        load_series(files[:1], keras.Sequential([keras.Input((5, 2)), keras.layers.Flatten(), keras.layers.Dense(2)]))


# ----------------------------------------------------------------------------- the factory
def test_build_accepts_name_class_instance_and_callable() -> None:
    model = _gap_model()
    x = np.ones((2, 8, 8, 2), np.float32)
    by_name = registry.build("Grad-CAM", model, {"layer": "conv"}, common={"batch_size": 1, "samples": 9})
    by_class = registry.build(ks.GradCAM, model, {"layer": "conv"})
    assert by_name.batch_size == 1 and not hasattr(by_name, "samples")
    np.testing.assert_allclose(by_name.explain(x, 0).attributions, by_class.explain(x, 0).attributions, rtol=1e-6)
    assert registry.build(by_class, model) is by_class

    def half_input(m, inputs, targets):
        return np.asarray(inputs) / 2

    wrapped = registry.build(half_input, model, common={"batch_size": 4})
    assert isinstance(wrapped, FunctionMethod) and wrapped.name == "half_input"
    np.testing.assert_array_equal(wrapped.explain(x, 1).attributions, x / 2)


def test_build_refuses_unknown_parameters_in_one_style() -> None:
    model = _gap_model()
    with pytest.raises(registry.UnknownParameterError, match=r"Method 'saliency' does not accept .*'samples'"):
        registry.build("saliency", model, {"samples": 3})
    with pytest.raises(TypeError, match="Received: samples=3"):  # still a TypeError, as the constructor's was
        ks.explain(model, np.ones((1, 8, 8, 2)), "saliency", samples=3)
    with pytest.raises(ValueError, match=r"No chosen method accepts the parameter\(s\) \['steps'\]"):
        registry.check_common(["gradcam", "saliency"], {"steps": 8})
    with pytest.raises(ValueError, match="explains a different model"):
        registry.build(ks.Saliency(_gap_model(1)), model)
    with pytest.raises(ValueError, match="Unknown method"):
        registry.build("gradkam", model)
    with pytest.raises(TypeError, match="must derive from kerascope.methods.Method"):
        registry.build(dict, model)


def test_resolved_params_pin_the_default_cam_layer() -> None:
    model = _gap_model()
    x = np.random.default_rng(2).random((2, 8, 8, 2)).astype(np.float32)
    method = ks.GradCAM(model)
    assert method.params()["layer"] is None
    resolved = method.resolved_params(x)
    assert resolved["layer"] == "conv"
    pinned = registry.build("gradcam", model, {"layer": resolved["layer"]})
    np.testing.assert_array_equal(pinned.explain(x, 2).attributions, method.explain(x, 2).attributions)
    assert ks.Saliency(model).resolved_params(x) == ks.Saliency(model).params()


# ----------------------------------------------------------------------------- the engine's public API
def test_engine_scores_and_scorer_match_the_forward_pass() -> None:
    model = _gap_model()
    x = np.random.default_rng(3).random((5, 8, 8, 2)).astype(np.float32)
    engine = Engine(model)
    logits = keras.ops.convert_to_numpy(model(x))
    scores, resolved = engine.scores(x, None, batch_size=2)
    np.testing.assert_array_equal(resolved, logits.argmax(-1))
    np.testing.assert_allclose(scores, logits.max(-1), rtol=1e-5, atol=1e-6)



# ----------------------------------------------------------------------------- the layering rules
def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(module, at_top_level)`` for every kerascope import in a file (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text())
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("kerascope"):
                names = [a.name for a in child.names]
                mods = [child.module] if child.module != "kerascope" else [f"kerascope.{n}" for n in names]
                found.extend((m, top) for m in mods)
            elif isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names if a.name.startswith("kerascope"))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    visit(tree, True)
    return found


def _package_of(module: str) -> str:
    """The package (or top-level module) of ``kerascope.<package>...``; ``kerascope`` for the root's own names."""
    parts = module.split(".")
    if len(parts) < 2:
        return "kerascope"
    if (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file():
        return parts[1]
    return "kerascope"  # a name of kerascope/__init__.py (`from kerascope import __version__`)


ORCHESTRATION = {
    "core", "_backend", "numeric", "propagation", "methods", "metrics", "features", "concepts", "language",
    "viz", "io", "report", "batch", "catalog", "data", "targets", "api", "pipeline", "evaluation", "callbacks",
    "evaluation_metrics", "kerascope",
}
#: What each package (or top-level module) of kerascope may import: docs/architecture.md's table.
ALLOWED = {
    "numeric": set(), "_backend": set(), "catalog": set(), "data": set(),
    "io": {"numeric"}, "viz": {"numeric"},
    "core": {"_backend", "numeric"},
    "propagation": {"core", "_backend", "numeric"},
    "methods": {"core", "propagation", "numeric", "catalog"},
    "features": {"core", "numeric"}, "concepts": {"core", "numeric"},
    "language": {"core", "methods", "numeric", "viz", "report"}, "metrics": {"core", "methods", "numeric"},
    "report": {"core", "io", "viz", "numeric", "kerascope"},
    "batch": {"core", "methods", "io", "viz", "report", "numeric", "kerascope"},
    **{name: ORCHESTRATION for name in ("api", "pipeline", "evaluation", "evaluation_metrics", "callbacks", "targets",
                                              "__init__")},
    "cli": ORCHESTRATION | {"cli"},
}
#: Imports inside functions only, each in one module: (module, package it may import lazily).
LAZY = {("core/explanation.py", "viz"), ("core/passes.py", "propagation")}


def _owner(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def test_every_package_has_a_row_in_the_layer_table() -> None:
    owners = {_owner(path) for path in PACKAGE.rglob("*.py")}
    assert owners <= set(ALLOWED), sorted(owners - set(ALLOWED))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_the_layer_table_allows(package: str) -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _owner(path) != package:
            continue
        relative = path.relative_to(PACKAGE).as_posix()
        for module, top in _imports(path):
            target = _package_of(module)
            if target == package or target in ALLOWED[package] or (not top and (relative, target) in LAZY):
                continue
            bad.append(f"{relative} imports {module}" + ("" if top else " (inside a function)"))
    assert not bad, bad


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_imports() -> dict[str, set[str]]:
    """``{module: modules it imports at load time}`` (module and class bodies; not functions, not TYPE_CHECKING).

    ``from kerascope.core import targets`` imports the submodule ``kerascope.core.targets`` (after the package).
    """
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}

    def visit(node: ast.AST, found: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").startswith("kerascope"):
                for alias in child.names:
                    submodule = f"{child.module}.{alias.name}"
                    found.add(submodule if submodule in modules else child.module)
            elif isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            visit(child, found)

    for name, path in modules.items():
        found: set[str] = set()
        visit(ast.parse(path.read_text()), found)
        graph[name] = {module for module in found if module in modules and module != name}
    return graph


def test_no_import_cycle_between_modules() -> None:
    graph = _load_time_imports()
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, cycles
    assert "kerascope.core.engine" in graph and graph["kerascope.core.passes"], "the walk found the engine's parts"


@pytest.mark.parametrize("package", ["core", "propagation"])
def test_core_and_propagation_modules_are_small_and_say_their_job(package: str) -> None:
    for path in sorted((PACKAGE / package).glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 600, f"{path.name}: {len(text.splitlines())} lines"
        docstring = ast.get_docstring(ast.parse(text))
        assert docstring, f"{path.name} has no docstring"


def test_no_module_of_kerascope_is_over_600_lines() -> None:
    long = {str(path.relative_to(PACKAGE)): n for path in sorted(PACKAGE.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > 600}
    assert not long, f"split these by job: {long}"


def test_the_engine_facade_keeps_every_name_importable() -> None:
    import kerascope.core.engine as engine_module

    for name in engine_module.__all__:
        assert hasattr(engine_module, name), name
    parts = {cls.__module__.rsplit(".", 1)[-1] for cls in Engine.__mro__[1:-1]}
    assert parts == {"layer_index", "input_checks", "call_counting", "graph_facts", "softmax_bypass", "passes",
                     "compiled"}


ENGINE_PARTS = {f"core/{name}.py" for name in (
    "engine", "layer_index", "input_checks", "call_counting", "graph_facts", "softmax_bypass", "passes", "compiled",
)}


def test_no_module_outside_the_engine_touches_its_private_members() -> None:
    pattern = re.compile(r"engine\._[a-z]|\._compiled\b|\._bypassed\b|\._detect_softmax|\._check_target_range")
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).as_posix() not in ENGINE_PARTS
        for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)
    ]
    assert not offenders, offenders


def test_method_names_have_one_source() -> None:
    from kerascope.catalog import METHODS

    classes = {entry.class_name for entry in METHODS}
    assert classes <= set(ks.methods.__all__) and classes <= set(ks.__all__)
    assert all(hasattr(ks.methods, name) for name in ks.methods.__all__)
