"""The id of the mistake a message names, what a learner reads for an exception, and how a
message is shown as data: one rule for the pytest plugin and the reports (the trusted side;
how long a message may be is the protocol's, :data:`~.protocol.MESSAGE_LIMIT`)."""

from __future__ import annotations

import hmac
import re
import secrets

# A graded test that recognises a known mistake (tests/graded/mistakes.py) puts its id in the
# test's message, sealed with a secret of the grader's own process: the learner's code runs in
# another process (the worker) that never sees the secret, so nothing it raises or prints can
# name a mistake. The plugin takes the sealed id out of the message into the record's
# ``mistake`` field, and every report reads that field, never the text.
_SEAL = secrets.token_hex(16)
_SEALED_TAG = re.compile(r"\[mistake (\d+\.\d+/[a-z0-9][a-z0-9_-]*) ([0-9a-f]{32})\]")
# The id as readers see it (and as a learner's text may imitate it).
MISTAKE_TAG = re.compile(r"\[mistake (\d+\.\d+/[a-z0-9][a-z0-9_-]*)\]")


def mistake_tag(mistake: str) -> str:
    """The sealed tag that names ``mistake`` in a graded test's message."""
    return f"[mistake {mistake} {_SEAL}]"


def unseal(message: str) -> tuple[str, str]:
    """``(text, mistake)``: the message without the grader's sealed tags, and the id of the
    last one ("" for none). Text that only looks like a tag (``[mistake ID]`` written by the
    learner's code, or a tag with another seal) names nothing and is marked as not the
    grader's."""
    named = ""

    def take(match: re.Match[str]) -> str:
        nonlocal named
        if hmac.compare_digest(match.group(2), _SEAL):
            named = match.group(1)
            return ""
        return f"[not the grader's: mistake {match.group(1)}]"

    text = _SEALED_TAG.sub(take, message or "")
    text = MISTAKE_TAG.sub(lambda m: f"[not the grader's: mistake {m.group(1)}]", text)
    return text.rstrip(), named


# Characters a terminal or an editor obeys rather than shows: C0 and C1 controls (a carriage
# return, an escape, U+009B, the CSI), DEL, the line and paragraph separators, and the
# marks, embeddings, overrides and isolates that reorder bidirectional text (U+202E).
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\x80-\x9f\u2028\u2029\u200e\u200f"
                     "\u202a-\u202e\u2066-\u2069]")


def one_line(text: object) -> str:
    """``text`` on one line, every control character (a carriage return, an escape
    sequence, a line break) shown as its escape: a name the learner chose (a file's) cannot
    move or restyle what a terminal, a log or a CI runner shows, nor start a line of its
    own (``::error``, a workflow command)."""
    return CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"),
                       str(text).replace("\n", "\\n"))


def markdown_code(text: str, table: bool = False) -> str:
    """``text`` as a Markdown code span (nothing in it is a heading, a link, HTML or
    emphasis), on one line (:func:`one_line`); ``table``: inside a table's cell (its ``|``
    escaped)."""
    text = one_line(text)
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    span = f"{fence}{pad}{text}{pad}{fence}"
    return span.replace("|", "\\|") if table else span


# PyTorch's errors that a learner's code meets most, and what each means for an exercise:
# (PyTorch's words, what to do; ``{0}``, ``{1}``: the pattern's groups). The first that
# matches is said after PyTorch's own message (:func:`learner_error`).
WAYS_FORWARD = tuple((re.compile(pattern), advice) for pattern, advice in (
    (r"does not require grad and does not have a grad_fn",
     "this result is not connected to autograd's graph: did a step leave PyTorch (NumPy, "
     ".item(), .detach(), torch.tensor(...) of computed values)? Build it from torch "
     "operations on the inputs."),
    (r"Can't call numpy\(\) on Tensor that requires grad",
     "NumPy is outside autograd's graph, so no gradient would flow back through it: compute "
     "with torch operations instead (torch.exp, torch.einsum, ... have NumPy's names)."),
    (r"Expected all tensors to be on the same device|is not on the expected device",
     "a tensor made in your code is on another device than the inputs: make new tensors on "
     "theirs (torch.zeros_like(x), torch.full_like(x, value), torch.eye(n, dtype=x.dtype, "
     "device=x.device)), never on the CPU by default."),
    (r"(?:must|to) have the same dtype|expected scalar type \w+ but found \w+",
     "two tensors of different dtypes met: a tensor made in your code has another dtype than "
     "the inputs (NumPy's float64, say): make new tensors with dtype=x.dtype."),
    (r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
     r"non-singleton dimension (-?\d+)",
     "two tensors whose shapes do not line up met in an elementwise operation (sizes {0} and "
     "{1} at dimension {2}): print the shapes of that line's operands; a maximum or a sum "
     "taken without keepdim=True, a missing unsqueeze or a transpose is the usual cause."),
    (r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)",
     "a matrix product (or an nn.Linear) whose inner sizes differ, {1} against {2}: the last "
     "size of the input must be the layer's in_features (d_model, d_ff?), or one operand needs "
     "a transpose."),
    (r"Expected size for first two dimensions of batch2 tensor to be: \[([\d, ]+)\] but got: "
     r"\[([\d, ]+)\]",
     "a batched matrix product (@, torch.matmul) whose operands do not line up: the right one "
     "should start [{0}] (its batch size, then the left one's last size), and it starts [{1}]. "
     "Check which tensor's length goes where: the scores of Lq queries against Lk keys are "
     "[..., Lq, Lk], and they multiply values of Lk rows."),
    (r"Sizes of tensors must match except in dimension (-?\d+)",
     "torch.cat joins tensors along dimension {0}, so every other size of theirs must agree: "
     "is {0} the dimension meant (the positions of [B, H, L, d_k] are dimension 2)?"),
    (r"shape '\[([-\d, ]*)\]' is invalid for input of size (\d+)",
     "a view or reshape to [{0}] asked for another number of entries than the tensor's {1}: "
     "take the sizes from the tensor itself (B, L, _ = x.shape) and check which are split or "
     "merged."),
    (r"view size is not compatible with input tensor's size and stride",
     "view() needs the memory in order, which a transpose changes: use .reshape(...), or "
     ".contiguous().view(...)."),
    (r"modified by an inplace operation|leaf Variable that requires grad is being used in an "
     r"in-place operation",
     "an in-place operation (x += ..., x[...] = ..., masked_fill_, a method ending in _) changed "
     "a tensor that autograd needs: use the form that returns a new tensor (x = x + ..., "
     "masked_fill, torch.where)."),
))
# The worker's words for a result it cannot send back (worker.process), and NumPy's type names.
_NOT_SENT = re.compile(r"^the result could not be sent back to the grader: a (\w+) is not plain "
                       r"data \(")
_NUMPY_TYPES = {"ndarray", "matrix", "float64", "float32", "float16", "int64", "int32", "bool_",
                "generic", "number"}


def learner_error(types: list[str], message: str, where: str = "") -> str:
    """What a learner reads for an exception their code raised (``types``: its classes, most
    derived first; ``message``: its text; ``where``: the learner's ``file:line``): PyTorch's
    message, where it was raised, and what it means for the exercise
    (:data:`WAYS_FORWARD`); a result of NumPy's in plain words; a message that names a
    known mistake (a test's own words) as it is."""
    raised, at = (types[0] if types else "Exception"), (f" (at {where})" if where else "")
    sent = _NOT_SENT.match(message)
    if sent is not None and sent.group(1) in _NUMPY_TYPES:
        what = ("a NumPy array (numpy.ndarray)" if sent.group(1) == "ndarray"
                else f"a NumPy value (numpy.{sent.group(1)})")
        return (f"your code returned {what} where a torch.Tensor is expected, so its result "
                f"could not be sent back to the grader: return a torch.Tensor. Compute with "
                f"torch operations (torch.from_numpy would convert the array, but outside "
                f"autograd's graph, so no gradient would flow through it).")
    if _SEALED_TAG.search(message) is None:
        for pattern, advice in WAYS_FORWARD:
            found = pattern.search(message)
            if found is not None:
                said = f"{raised}: {message}{at}"
                stop = "" if said.endswith((".", "!", "?")) else "."
                return f"{said}{stop} What it means here: {advice.format(*found.groups())}"
    return f"{raised}: {message}{at}"
