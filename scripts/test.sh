#!/usr/bin/env bash
# Install kerascope with everything its tests need, then run the test suite.
# Works on a fresh machine with Python 3.11 (root for the optional apt-get of Chromium).
#   bash scripts/test.sh            # everything
#   FAST=1 bash scripts/test.sh     # skip the Ray tests (-m "not ray")
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export TF_CPP_MIN_LOG_LEVEL=3 PIP_DISABLE_PIP_VERSION_CHECK=1 RAY_AUTH_MODE=disabled
export MPLBACKEND=Agg KERAS_BACKEND=${KERAS_BACKEND:-tensorflow}

step() { printf '\n== %s\n' "$*"; }
# TensorFlow prints start-up lines (absl, cudart_stub, oneDNN) to descriptor 2 before it reads
# TF_CPP_MIN_LOG_LEVEL, in every process that imports it: pytest's own when it is not capturing, test
# subprocesses, Ray workers. quiet CMD... runs CMD with its standard error filtered of exactly those lines.
quiet() {
  local rc=0
  "$@" 2> >("$PY" -c "from kerascope.cli.quiet import filter_stdin; filter_stdin()" >&2) || rc=$?
  wait 2>/dev/null || true  # the filter has written its last line
  return $rc
}

step "install kerascope and test dependencies"
# The reference libraries installed with --no-deps below declare pins that kerascope's environment does not
# meet (Xplique: TensorFlow <= 2.20; KerasHub: tensorflow-text); the tests use only the parts that work with
# it, so pip's conflict report is switched off for those lines (--no-warn-conflicts).
# torch==2.13.0 resolves to a CPU build on these machines; a bare `torch` would pull a multi-GB CUDA build.
"$PY" -m pip install -q -e ".[tensorflow,test,ray]" "torch==2.13.0" "captum" "jax[cpu]"
# zennit (LRP reference, tests/test_lrp_zennit.py): --no-deps keeps torch 2.13; its torchvision helpers are
# never imported by the test (torchvision does not load beside torch 2.13). ~2 s.
"$PY" -m pip install -q --no-deps "zennit==0.5.1"
# quantus (reference for the metric families, tests/test_quantus_crosscheck.py): --no-deps, because its own
# requirements would not change anything here but its [tensorflow] extra pins Keras 2; the light packages it
# imports (cachetools, opencv-python-headless, scikit-learn, scikit-image) come with the test extra. ~2 s.
"$PY" -m pip install -q --no-warn-conflicts --no-deps "quantus==0.6.0"
# pytorch-grad-cam (tests/test_cam_library_variants.py) and Xplique (tests/test_sensitivity.py), the references of
# the CAM variants / FullGrad and of Sobol / HSIC: --no-deps keeps torch 2.13 (no torchvision; the CAM test
# stands in an empty torchvision module for the helpers it never calls) and Keras / TensorFlow as they are;
# their light imports (ttach, opencv-python-headless, deprecated, einops) are in the `test` extra. Xplique's HSIC
# module imports tensorflow_probability, which needs tf-keras of the same TensorFlow version.
"$PY" -m pip install -q --no-warn-conflicts --no-deps "grad-cam==1.5.7" "xplique==2.0.2"
"$PY" -m pip install -q --no-warn-conflicts "tensorflow-probability==0.25.0" \
  "tf-keras==$("$PY" -c 'from importlib.metadata import version; print(version("tensorflow"))')"
# KerasHub (language models and transformers, tests/test_language*.py): --no-deps keeps keras / tensorflow as they
# are (its tensorflow-text pin is not needed for the tiny in-memory tokenizers the tests build).
"$PY" -m pip install -q --no-warn-conflicts --no-deps "keras-hub==0.32.*"
"$PY" -m pip install -q --no-warn-conflicts tokenizers sentencepiece absl-py rich regex kagglehub

step "install headless Chromium for the HTML report test (Debian package)"
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "could not install chromium: the browser test will be skipped"
  else
    echo "chromium not installed and not root: the browser test will be skipped"
  fi
fi

step "lint, and every imported package declared"
"$PY" -m ruff check kerascope tests bench scripts
"$PY" scripts/check_imports.py

step "tests (TensorFlow backend: everything)"
markers="not slow"
[ -n "${FAST:-}" ] && markers="not slow and not ray"
# the docstring examples of every public name run too (other backends' modules are tested in their own runs)
quiet "$PY" -m pytest -q -p no:cacheprovider -m "$markers" --timeout 900 --durations=15 \
  --doctest-modules tests kerascope --ignore=kerascope/_backend/jax.py --ignore=kerascope/_backend/torch.py "$@"

# The same API on JAX and PyTorch. Test files that need TensorFlow for their reference computations
# (test_core, test_cam_family, the seed cases, callbacks, performance contract) run on TensorFlow only;
# tests/test_backend_parity.py (above) compares all three backends on identical weights. test_model_kinds runs a
# light part of every model kind here (the rest under -m slow: JAX compiles every method for every model).
# The layer-attribution, CLI-model, plot and BN-folding files take seconds on PyTorch but ~40 s of compilation on JAX: PyTorch only here (they pass on
# JAX too: KERAS_BACKEND=jax python -m pytest tests/test_layer_attribution.py tests/test_cli_models.py ...). So does
# tests/test_conductance.py (one compiled function per path length and gated unit: ~1 min of JAX compilation) and
# tests/test_shapley_cam.py (~1 min compiling forward-over-reverse second derivatives on JAX).
# The language-model files (generation, attention, rollout, pictures) run on both: on JAX one light test per feature
# (the GPT-2 / BERT / Gemma / ViT and other compile-heavy cases under -m slow).
# So do the thread-isolation, callable-target / other-head, batch-invariance and channels_first files
# (15-20 s each on PyTorch, 50-140 s on JAX; channels_first convolutions do not run on TensorFlow's CPU).
for backend in jax torch; do
  step "tests ($backend backend: backend-independent files and the backend's own examples)"
  extra=()
  if [ "$backend" = jax ]; then  # language models: the compile-heavy cases are marked slow on JAX
    extra=(tests/test_language.py tests/test_generation_segments.py tests/test_attention.py
           tests/test_gradient_rollout.py tests/test_language_pictures.py)
  fi
  if [ "$backend" = torch ]; then
    extra=(tests/test_layer_attribution.py tests/test_cli_models.py tests/test_plots_kinds.py tests/test_bn_fold.py
           tests/test_conductance.py tests/test_cam_library_variants.py tests/test_sensitivity.py
           tests/test_targets_positions.py tests/test_attention.py tests/test_language.py
           tests/test_thread_isolation.py tests/test_targets_and_heads.py tests/test_batch_invariance.py
           tests/test_channels_first.py tests/test_cam_tied_embedding.py tests/test_gradient_rollout.py
           tests/test_generation_segments.py tests/test_language_pictures.py tests/test_shapley_cam.py)
  fi
  KERAS_BACKEND=$backend quiet "$PY" -m pytest -q -p no:cacheprovider -m "$markers" --timeout 900 \
    tests/test_gradient_family.py tests/test_deeplift.py tests/test_perturbation.py tests/test_metrics.py tests/test_cli.py \
    tests/test_plots.py tests/test_evaluation.py tests/test_batch_local.py tests/test_report_browser.py tests/test_architecture.py \
    tests/test_cam_models.py tests/test_lrp.py tests/test_tolerance.py tests/test_precision.py \
    tests/test_feature_masks.py tests/test_feature_masks_peers.py tests/test_metrics_quantus.py tests/test_road_mprt.py tests/test_pic.py tests/test_hardening.py tests/test_shared_layers.py \
    tests/test_fuzz.py --hypothesis-profile=ci-small \
    tests/test_model_kinds.py tests/test_gradient_inputs.py tests/test_guided_paths.py tests/test_xrai.py \
    tests/test_feature_visualization.py tests/test_tcav.py tests/test_craft.py tests/test_clear_errors.py tests/test_zero_maps.py \
    tests/test_maco_magnitude.py \
    tests/test_sigmoid_head.py tests/test_vit_zero_cam.py tests/test_evaluation_metrics.py \
    ${extra[@]+"${extra[@]}"} \
    --doctest-modules "kerascope/_backend/$backend.py"
done
