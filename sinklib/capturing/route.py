"""The route: while any capture is open, `torch.nn.functional.scaled_dot_product_attention` is replaced by a
function that hands the call to the recorder of the attention layer now running (entered and left through
that layer's forward hooks) and, outside every captured layer, to torch's own SDPA unchanged."""
from __future__ import annotations

import threading
from typing import Callable

import torch.nn.functional as F

_lock = threading.Lock()
_users = 0
_original: Callable | None = None
_thread_state = threading.local()  # .frames: stack of (recorder, AttentionLayer) for the running layer


def frames() -> list:
    """This thread's stack of (recorder, layer) pairs: the innermost captured attention layer running, last."""
    if not hasattr(_thread_state, "frames"):
        _thread_state.frames = []
    return _thread_state.frames


def original_sdpa(query, key, value, **kwargs):
    """torch's own scaled_dot_product_attention, as it was before any capture opened."""
    return (_original or F.scaled_dot_product_attention)(query, key, value, **kwargs)


def _routed_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kwargs):
    stack = frames()
    while stack and stack[-1][0].closed:  # a frame a failed forward left in this thread after its capture closed
        stack.pop()
    if not stack:
        return original_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                             scale=scale, enable_gqa=enable_gqa, **kwargs)
    recorder, layer = stack[-1]
    return recorder.attend(layer, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, kwargs)


def install() -> None:
    """Route SDPA through sinklib (counted: the last `remove` of nested or concurrent captures restores torch's)."""
    global _users, _original
    with _lock:
        if _users == 0:
            _original = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = _routed_sdpa
        _users += 1


def remove() -> None:
    """Undo one `install`; the last one restores torch's own SDPA (unless something else replaced it since)."""
    global _users
    with _lock:
        _users -= 1
        if _users == 0 and F.scaled_dot_product_attention is _routed_sdpa:
            F.scaled_dot_product_attention = _original


def enter(recorder, layer) -> None:
    """Push (recorder, layer) on this thread's stack: that layer's SDPA calls now go to the recorder."""
    frames().append((recorder, layer))


def leave(recorder) -> None:
    """Pop the innermost frame of this thread's stack if it is `recorder`'s."""
    stack = frames()
    if stack and stack[-1][0] is recorder:
        stack.pop()


def forget(recorder) -> None:
    """Drop every frame of `recorder` from this thread's stack (a capture ending, whatever a failed forward left):
    a later capture never sees a frame of a closed one."""
    stack = frames()
    stack[:] = [frame for frame in stack if frame[0] is not recorder]
