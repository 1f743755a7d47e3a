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


# ----------------------------------------------------------------------------- the docs' examples
def test_doc_gradient_cam_example_equals_gradcam_under_global_average_pooling(restore_registry) -> None:
    namespace: dict = {}
    exec(_doc_blocks()[0], namespace)  # noqa: S102 - the documented example, as a newcomer would paste it
    assert registry.get("maxgradcam") is namespace["MaxGradCAM"]
    model = _gap_model()
    x = np.random.default_rng(0).random((3, 8, 8, 2)).astype(np.float32)
    ours = ks.explain(model, x, "maxgradcam", targets=[0, 1, 3], layer="conv")
    reference = ks.GradCAM(model, layer="conv").explain(x, [0, 1, 3])
    # GAP + Dense: dS/dA is the same at every position, so max over space == mean over space
    np.testing.assert_allclose(ours.attributions, reference.attributions, rtol=1e-5, atol=1e-6)
    assert float(np.abs(ours.attributions).max()) > 0


def test_doc_perturbation_example_equals_the_linear_closed_form(restore_registry) -> None:
    namespace: dict = {}
    exec(_doc_blocks()[1], namespace)  # noqa: S102
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
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize(
    ("package", "allowed"),
    [
        ("numeric", {"numeric"}),
        ("_backend", {"_backend"}),
        ("viz", {"viz", "numeric"}),
        ("core", {"core", "_backend", "numeric"}),
        ("methods", {"methods", "core", "numeric", "catalog"}),
        ("features", {"features", "core", "numeric"}),
        ("concepts", {"concepts", "core", "numeric"}),
    ],
)
def test_low_packages_import_nothing_above_them(package: str, allowed: set[str]) -> None:
    bad = []
    for path in sorted((PACKAGE / package).glob("*.py")):
        for module, top in _imports(path):
            target = _package_of(module)
            lazy_viz = package == "core" and path.name == "explanation.py" and target == "viz" and not top
            if target not in allowed and not lazy_viz:
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, bad


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
