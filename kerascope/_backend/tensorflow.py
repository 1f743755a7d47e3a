"""TensorFlow implementation of kerascope's differentiation primitives.

Two things live here: compiling a ``forward`` function (written once in
Keras terms by :mod:`kerascope.core.engine`) into a ``tf.function`` that
returns scores, activations and gradients; and ReLU functions with a
modified backward rule (guided backprop, deconvnet).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from kerascope._backend import neutral, tf_fused
from kerascope._backend.errors import StatefulModelError
from kerascope._backend.neutral import modified_relu, rescale_relu  # noqa: F401  (the backend interface)
from kerascope._backend.tf_conv import conv_op  # noqa: F401  (re-exported: the backend interface)

NAME = "tensorflow"
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kerascope/, not importing it


def _to_numpy(value: Any) -> Any:
    if value is None:
        return None
    return tf.nest.map_structure(lambda t: t.numpy(), value)


def _traced_once(function: Any) -> Any:
    """Keep TensorFlow's "N out of the last N calls ... triggered tf.function retracing" notice off kerascope's functions.

    Each compiled function has a full ``input_signature`` and is traced exactly once; but
    TensorFlow counts traces per Python code object, so the many functions kerascope compiles
    from one closure (one per method, layer set and target kind) look like one function
    retracing, and after a few explainers in a script it would warn about the user's run.
    Only these functions are exempted; a user's own tf.functions keep the notice.
    """
    if hasattr(function, "_omit_frequent_tracing_warning"):
        function._omit_frequent_tracing_warning = True
    return function


def _function(fn: Callable[..., Any], signature: Any, jit_compile: bool) -> Callable[..., Any]:
    """``tf.function`` of ``fn`` with a full input signature, traced without AutoGraph.

    kerascope's traced code has no tensor-dependent Python control flow, so AutoGraph's
    source-to-source rewrite of it (about two thirds of the first call's tracing time on
    MobileNetV2: every kerascope function on the traced path was parsed and rewritten) buys
    nothing. Nor did it ever convert a model's own ``call``: Keras layers are called unconverted,
    so a model that branches in Python on a tensor value fails to trace either way.

    Example:
        >>> f = _function(lambda x: x * 2, [tf.TensorSpec((None,), tf.float32)], False)
        >>> f(tf.constant([1.0])).numpy().tolist()
        [2.0]
    """
    return _traced_once(tf.function(fn, input_signature=signature, jit_compile=jit_compile, autograph=False))


def _call(compiled: Callable[..., Any], *args: Any) -> Any:
    """Call a ``tf.function``; kerascope's own errors raised while tracing come back as raised.

    AutoGraph re-raises an error from traced code with an "in user code:" trace
    prepended; for errors that kerascope raised (a layer not on the path to the score,
    a non-differentiable target) the message is what the user needs, so it is
    re-raised here as it was written, from this frame. (TensorFlow's record of the cause
    starts with the type's name, ``"ValueError: ..."``; that prefix is dropped, else the
    traceback's last line would read ``ValueError: ValueError: ...``.)

    Example:
        >>> from kerascope.numeric.chunking import check_batch_size
        >>> f = _function(lambda x: check_batch_size(0), [tf.TensorSpec((None,), tf.float32)], False)
        >>> try:
        ...     _call(f, tf.constant([1.0]))
        ... except ValueError as error:
        ...     print(str(error))
        `batch_size` must be a positive int. Received: batch_size=0.
    """
    try:
        return compiled(*args)
    except (ValueError, TypeError) as error:
        metadata = getattr(error, "ag_error_metadata", None)
        stack = getattr(metadata, "translated_stack", None) or ()
        innermost = str(getattr(stack[-1], "filename", "")) if stack else ""
        if metadata is None or not innermost.startswith(_PACKAGE) or type(error) not in (ValueError, TypeError):
            raise
        message = str(metadata.cause_message)
        prefix = f"{type(error).__name__}: "
        raise type(error)(message[len(prefix):] if message.startswith(prefix) else message) from None


def _dense(gradient: Any) -> tf.Tensor:
    """A gradient as a dense tensor: an ``Embedding``'s gradient is ``IndexedSlices`` (the rows looked up).

    Example:
        >>> s = tf.IndexedSlices(tf.ones((1, 2)), tf.constant([1]), tf.constant([3, 2]))
        >>> _dense(s).numpy().tolist()
        [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    """
    if isinstance(gradient, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(gradient.values, gradient.indices, gradient.dense_shape[0])
    return gradient


_CPU_OPTIONS: list[Any] = []  # [FunctionCallOptions or None], computed on first use


def _cpu_call_options() -> Any:
    """The call options kerascope's functions run with on a machine without GPUs (``None``: TensorFlow's own).

    On the first call of a compiled function TensorFlow's graph optimiser (Grappler) rewrites the
    graph; on MobileNetV2 (Grad-CAM, 4 images, one thread) that was ~0.35 s of the first call's
    ~0.8 s. Three of its settings buy nothing on a CPU: the second pass of every optimiser
    (``meta_optimizer_iterations``: the first pass does the work, the second removed 7 of ~1050
    nodes), the layout optimiser (NHWC <-> NCHW for GPU kernels) and the memory optimiser
    (recomputation and swapping for GPU memory). They are set to one pass / off for kerascope's
    functions only (the call's ``config_proto``, on the calling thread, restored after each call),
    and only where the user left TensorFlow's defaults; so is the MLIR "TFG" pass pipeline, which
    here only sorts and re-exports the graph (24 + 8 ms of MobileNetV2's Saliency graph). Every
    other optimiser (constant folding, remapper fusions, arithmetic, pruning) runs as before; a
    function without loops also skips constant folding, shape and loop optimisation
    (:func:`_loop_free_options`). Same results bit for bit, the same time per later call
    (``docs/performance.md``). With a GPU visible nothing changes.

    Example:
        >>> options = _cpu_call_options()
        >>> options is None or isinstance(options.config_proto_serialized, bytes)
        True
    """
    if _CPU_OPTIONS:
        return _CPU_OPTIONS[0]
    options = None
    try:
        from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
        from tensorflow.python.eager import context

        if not tf.config.list_logical_devices("GPU"):
            base = context.context().function_call_options
            config = config_pb2.ConfigProto.FromString(base.config_proto_serialized)
            rewrite, options_pb = config.graph_options.rewrite_options, rewriter_config_pb2.RewriterConfig
            if rewrite.meta_optimizer_iterations == options_pb.DEFAULT_NUM_ITERS:
                rewrite.meta_optimizer_iterations = options_pb.ONE
            if rewrite.layout_optimizer == options_pb.DEFAULT:
                rewrite.layout_optimizer = options_pb.OFF
            if rewrite.memory_optimization == options_pb.DEFAULT_MEM_OPT:
                rewrite.memory_optimization = options_pb.NO_MEM_OPT
            if not rewrite.disable_tfg_optimizer and not rewrite.optimizers:
                rewrite.disable_tfg_optimizer = True
            options = context.FunctionCallOptions(executor_type=base.executor_type, config_proto=config)
    except (ImportError, AttributeError, TypeError, ValueError):  # another TensorFlow's internals: its defaults
        options = None
    _CPU_OPTIONS.append(options)
    return options


_LOOP_FREE: dict[int, Any] = {}  # id(options) -> (options, the same without the loop optimisers)

#: Grappler optimisers that pay only on graphs with loops: an RNN's ``While`` body (constant folding,
#: shape and loop optimisation each bought 7-13% of an LSTM's later calls); elsewhere they only cost
#: the first call (MobileNetV2 224 px: ~0.06 CPU s of Saliency's and Grad-CAM's instantiation).
_LOOP_OPTIMISERS = ("constant_folding", "shape_optimization", "loop_optimization")

#: Ops that make a function "with loops".
_LOOP_OPS = frozenset({"While", "StatelessWhile", "For", "_While"})


def _loop_free_options(options: Any) -> Any:
    """``options`` with :data:`_LOOP_OPTIMISERS` off (where left at TensorFlow's default), for functions
    without loops; ``None`` (TensorFlow's own options) stays ``None``.

    Example:
        >>> _loop_free_options(None) is None
        True
    """
    if options is None:
        return None
    cached = _LOOP_FREE.get(id(options))
    if cached is not None and cached[0] is options:
        return cached[1]
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.eager import context

    config = config_pb2.ConfigProto.FromString(options.config_proto_serialized)
    rewrite = config.graph_options.rewrite_options
    for name in _LOOP_OPTIMISERS:
        if getattr(rewrite, name) == rewriter_config_pb2.RewriterConfig.DEFAULT:
            setattr(rewrite, name, rewriter_config_pb2.RewriterConfig.OFF)
    loop_free = context.FunctionCallOptions(executor_type=options.executor_type, config_proto=config)
    _LOOP_FREE[id(options)] = (options, loop_free)
    return loop_free


def _nodes(concrete: Any) -> list[Any]:
    """Every node of a traced function's graph and of the functions it calls."""
    graph_def = concrete.graph.as_graph_def()
    return [node for group in [graph_def.node, *(f.node_def for f in graph_def.library.function)] for node in group]


def _has_loops(concrete: Any, nodes: list[Any] | None = None) -> bool:
    """Whether a traced function runs a loop (a ``While`` op in its graph or any function it calls).

    ``nodes``: :func:`_nodes` of ``concrete`` when the caller has them (one graph walk, not two).

    Example:
        >>> f = tf.function(lambda n: tf.while_loop(lambda i: i < n, lambda i: [i + 1], [0]))
        >>> _has_loops(f.get_concrete_function(tf.constant(3))), _has_loops(tf.function(tf.abs).get_concrete_function(1.0))
        (True, False)
    """
    return any(node.op in _LOOP_OPS for node in (_nodes(concrete) if nodes is None else nodes))


def _writes_variables(concrete: Any, nodes: list[Any]) -> list[str]:
    """The nodes of ``concrete`` that assign a variable (``AssignVariableOp``, resource scatters, ...).

    kerascope's passes assign nothing, and neither do Keras layers at inference; a node like this
    is the model changing its own state (a layer that updates statistics or a metric whatever
    ``training`` says), which every pass would repeat on the user's model. A seed generator's state
    (advanced by a random draw, e.g. a VAE's sampling layer next to the explained output) is not
    counted: randomness is the determinism check's to report (``core/engine.py``).

    Example:
        >>> v = tf.Variable(0.0)
        >>> f = tf.function(lambda x: v.assign_add(x)).get_concrete_function(1.0)
        >>> _writes_variables(f, _nodes(f))
        ['AssignAddVariableOp']
        >>> g = tf.function(lambda x: x * v).get_concrete_function(1.0)
        >>> _writes_variables(g, _nodes(g))
        []
    """
    def writes(op: str) -> bool:
        return (op.startswith("Assign") and op.endswith("VariableOp")) or op.startswith("ResourceScatter") or (
            op == "ResourceStridedSliceAssign")

    graph = concrete.graph
    seeds = {id(v.handle) for v in getattr(graph, "variables", ()) if "seed_generator_state" in v.name}
    skip = {internal.op.name for external, internal in graph.captures if id(external) in seeds}
    return sorted({node.name for node in nodes
                   if writes(node.op) and not (node.input and node.input[0].split(":")[0] in skip)})


@contextlib.contextmanager
def _call_options(loops: bool = True) -> Iterator[None]:
    """Run kerascope's compiled functions with :func:`_cpu_call_options` (on this thread, restored on exit).

    ``loops=False``: the function has none (:func:`_has_loops`); :func:`_loop_free_options`.

    Example:
        >>> with _call_options():
        ...     tf.function(lambda x: x + 1)(tf.constant(1.0)).numpy().tolist()
        2.0
    """
    options = _cpu_call_options() if loops else _loop_free_options(_cpu_call_options())
    if options is None:
        yield
        return
    from tensorflow.python.eager import context

    ctx = context.context()
    previous = ctx.function_call_options
    ctx.function_call_options = options
    try:
        yield
    finally:
        ctx.function_call_options = previous


def _refuse_variable_writes(concrete: Any, nodes: list[Any]) -> None:
    """Raise ``StatefulModelError`` when a traced pass assigns variables (see :func:`_writes_variables`)."""
    written = _writes_variables(concrete, nodes)
    if written:
        raise StatefulModelError(
            "The model changes its variables when called at inference (training=False): the compiled pass "
            f"assigns variables. Received: ops {written[:5]}{' ...' if len(written) > 5 else ''} (e.g. a layer that "
            "updates statistics or a metric inside call() whatever `training` says). Each pass would change your "
            "model; nothing was run. Let such layers follow `training` to explain the model as `predict()` uses it."
        )


def _direct(compiled: Any) -> Callable[..., Any]:
    """Call ``compiled`` (a ``tf.function`` with a full ``input_signature``) through :func:`_call` once,
    then its one traced concrete function directly.

    A ``tf.function`` call matches the arguments against its trace cache every time (~0.3 ms of
    host time per call on CPU, measured with cProfile: 1.4 ms against 0.65 ms profiled); with a
    full signature there is one trace, so the concrete function is the same computation.
    Every call runs with :func:`_call_options` (the same options each time: one instantiation;
    without loops, :func:`_loop_free_options`).

    Example:
        >>> f = _direct(tf.function(lambda x: x + 1, input_signature=[tf.TensorSpec((None,), tf.float32)]))
        >>> [f(tf.constant([1.0])).numpy().tolist() for _ in range(2)]
        [[2.0], [2.0]]
    """
    concrete: list[Any] = []  # [the traced function, whether it has loops]

    def call(*args: Any) -> Any:
        if not concrete:  # trace (kerascope's own errors come back as raised), then look for loops
            with _call_options():  # nested functions record the options current while they are traced
                traced = _call(compiled.get_concrete_function, *args)
            nodes = _nodes(traced)
            _refuse_variable_writes(traced, nodes)  # before it ever runs: the model is not changed
            concrete.extend([traced, _has_loops(traced, nodes=nodes) if _cpu_call_options() is not None else True])
        with _call_options(concrete[1]):
            return concrete[0](*args)

    return call


def compile_gradients(forward: neutral.Forward, **request: Any) -> neutral.GradientFunction:
    """Compile ``forward`` with a gradient tape (``request``: :class:`~kerascope._backend.neutral.GradientRequest`);
    the batch dimension is ``None``.

    Only what is differentiated is watched by the tape (not every variable the model reads).

    Example:
        >>> import numpy as np
        >>> def forward(inputs, targets, transform):
        ...     s = tf.reduce_sum(inputs[0] ** 2, axis=1)
        ...     return s, targets, []
        >>> fn = compile_gradients(forward, input_specs=[((None, 2), "float32")],
        ...                        wrt_inputs=True, layer_names=[], weights=[])
        >>> fn([np.array([[1.0, 2.0]], "float32")], np.array([0]))["input_grads"][0].tolist()
        [[2.0, 4.0]]
    """
    r = neutral.GradientRequest(**request)
    layer_names, on_trace, post = r.layer_names, r.on_trace, r.post
    signature = [
        [tf.TensorSpec(shape=(None, *shape[1:]), dtype=dtype) for shape, dtype in r.input_specs],
        tf.TensorSpec(shape=(None,), dtype=tf.int32),
    ]
    weights = list(r.weights)
    wrt = r.wrt

    def step(inputs: list[tf.Tensor], targets: tf.Tensor) -> dict[str, Any]:
        if on_trace is not None:
            on_trace()
        watched = [inputs[i] for i in wrt]
        # only what is differentiated is watched: with every variable the model reads watched (the default),
        # the tape recorded the whole forward pass, and a gradient w.r.t. a late layer (Grad-CAM) traced
        # the backward pass of the entire network, kernels' gradients included, for Grappler to prune
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            if wrt:
                tape.watch(watched)
            if weights:
                tape.watch(weights)

            def transform(_: int, __: Any, output: Any) -> Any:
                tape.watch(output)
                return output

            scores, resolved, acts = forward(inputs, targets, transform)
            total = tf.reduce_sum(tf.cast(scores, tf.float32))
        sources = {"acts": acts, "weights": weights}
        if wrt:
            sources["inputs"] = watched
        grads = tape.gradient(total, sources)
        for name, grad in zip(layer_names, grads["acts"]):
            if grad is None:
                raise neutral.no_path_error(name)
        if wrt and any(g is None for g in grads["inputs"]):
            raise neutral.not_differentiable_error()
        return neutral.gradient_result(
            scores, resolved, acts, grads["acts"], grads["weights"], weights, grads["inputs"] if wrt else None,
            cast=lambda t: tf.cast(_dense(t), tf.float32), post=post,
        )

    compiled = _direct(_function(step, signature, r.jit_compile))

    def run(inputs: list[np.ndarray], targets: np.ndarray) -> dict[str, Any]:
        result = compiled(
            [tf.convert_to_tensor(x) for x in inputs],
            tf.convert_to_tensor(np.asarray(targets, dtype=np.int32)),
        )
        return {key: _to_numpy(value) for key, value in result.items()}

    return run


def compile_forward(
    forward: neutral.ForwardOnly, *, input_specs: neutral.Specs, jit_compile: bool = False
) -> neutral.ForwardFunction:
    """Compile a gradient-free forward function of a list of inputs (a ``tf.function``, XLA with ``jit_compile``).

    Example:
        >>> import numpy as np
        >>> fn = compile_forward(lambda xs: xs[0] * 2, input_specs=[((None, 1), "float32")])
        >>> fn([np.ones((2, 1), "float32")]).tolist()
        [[2.0], [2.0]]
    """
    signature = [[tf.TensorSpec(shape=(None, *s[1:]), dtype=d) for s, d in input_specs]]
    compiled = _direct(_function(forward, signature, jit_compile))

    def run(inputs: list[np.ndarray]) -> Any:
        return _to_numpy(compiled([tf.convert_to_tensor(x) for x in inputs]))

    return run


def bias_add(x: Any, bias: Any) -> Any:
    """``x + bias``, ``bias`` one value per channel of ``x``'s last axis: TensorFlow's ``BiasAdd`` op.

    Grappler's remapper fuses a ``BiasAdd`` (not an ``AddV2``) into the convolution / matrix product
    that produces ``x``, with the ReLU / ReLU6 after it and a residual ``Add`` + ReLU (oneDNN's
    post-ops): on ResNet50 every convolution of a folded forward pass then runs as one op.

    Example:
        >>> bias_add(tf.zeros((1, 2, 2)), tf.constant([1.0, 2.0])).numpy()[0, 0].tolist()
        [1.0, 2.0]
        >>> import numpy as np
        >>> bias_add(tf.zeros((1, 2)), np.array([1.0, 2.0])).numpy().tolist()  # float64 NumPy: a plain addition
        [[1.0, 2.0]]
    """
    x = tf.convert_to_tensor(x)
    dtype = getattr(bias, "dtype", None)
    if dtype is None or tf.as_dtype(dtype) != x.dtype or x.shape.rank is None or x.shape.rank < 2:
        return x + bias  # TensorFlow's own addition (it casts a NumPy bias of another float type)
    return tf.nn.bias_add(x, bias)


def select(condition: Any, a: Any, b: Any) -> Any:
    """``a`` where ``condition``, else ``b``; element-wise, the three of one shape (``keras.ops.where``'s numbers).

    With equal static shapes this is TensorFlow's same-shape ``Select`` kernel: on CPU about half
    the time of ``SelectV2`` (what ``tf.where`` runs, with broadcasting), measured by the rule-fusion study in
    ``bench/HISTORY.md``; otherwise ``tf.where``.

    Example:
        >>> select(tf.constant([True, False]), tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])).numpy().tolist()
        [1.0, 4.0]
    """
    a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
    condition = tf.convert_to_tensor(condition)
    if condition.shape.as_list() == a.shape.as_list() == b.shape.as_list() and a.shape.rank is not None:
        return tf.raw_ops.Select(condition=condition, x=a, y=b)
    return tf.where(condition, a, b)


def fuses_rules() -> bool:
    """Whether ``custom_backward(fuse=...)`` compiles rules into one kernel here (XLA compiles on this machine).

    Example:
        >>> fuses_rules()
        True
    """
    return tf_fused.available()


def custom_backward(
    fn: Callable[..., Any], backward: neutral.Backward, name: str, fuse: neutral.Fuse = None
) -> Callable[..., Any]:
    """``fn(*xs)`` (tensors in, one tensor out) with the backward pass ``backward`` (a ``tf.custom_gradient``).

    ``backward`` (described at :data:`kerascope._backend.neutral.Backward`) is written once in
    ``keras.ops`` by the callers (e.g. the DeepLIFT rules), so every backend computes the same.
    ``fuse``: ``(key, f, exact)``, ``f`` the same function as ``fn`` but
    holding nothing of the model, ``key`` determining ``f`` and ``backward``:
    the backward pass then runs as one XLA-compiled kernel, shared by every
    call site with that key (:mod:`kerascope._backend.tf_fused`; float32 only
    and where XLA compiles, else the ops as written). ``exact``: XLA's ``f``
    equals TensorFlow's bit for bit, so the kernel recomputes ``fn(*xs)``
    instead of reading it.

    Example:
        >>> twice = custom_backward(lambda x: x * 3.0, lambda xs, y, dy, vjp: [2.0 * vjp(dy)[0]], "twice")
        >>> x = tf.constant([1.0, 2.0])
        >>> with tf.GradientTape() as t:
        ...     t.watch(x)
        ...     y = tf.reduce_sum(twice(x))
        >>> t.gradient(y, x).numpy().tolist()
        [6.0, 6.0]
    """

    @tf.custom_gradient
    def wrapped(*xs: tf.Tensor) -> Any:
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(xs)
            y = fn(*xs)

        def grad(dy: tf.Tensor) -> list[tf.Tensor]:
            if fuse is not None and tf_fused.applies(list(xs), dy):
                key, again, exact = fuse
                return tf_fused.kernel(key, again, backward)(list(xs), None if exact else y, dy)

            def vjp(d: Any) -> list[Any]:
                grads = tape.gradient(y, list(xs), output_gradients=d)
                return [tf.zeros_like(x) if g is None else g for g, x in zip(grads, xs)]

            return list(backward(list(xs), y, dy, vjp))

        return y, grad

    return neutral.named_call(wrapped, tf.convert_to_tensor, name)
