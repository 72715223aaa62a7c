"""The recompute from the fused kernel's log-sum-exp: same output bits as F.scaled_dot_product_attention,
probabilities exp(q·k·scale − lse) equal to an independent float32 softmax."""
import math

import pytest
import torch
import torch.nn.functional as F

from sinklib import attention_math
from sinklib.attention_math import attention_statistics, sdpa_with_lse


def _inputs(dtype=torch.float32, seq=96, heads=4, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, heads, seq, dim, generator=g).to(dtype) * 2 for _ in range(3)]


def _masks(seq=96):
    g = torch.Generator().manual_seed(1)
    keep = torch.rand(2, 1, seq, seq, generator=g) > 0.3
    keep[:, :, :, 0] = True
    padded = torch.zeros(2, 1, seq, seq)
    padded[1, :, :, :10] = torch.finfo(torch.float32).min  # left padding, as transformers masks it
    padded[1, :, :10, :] = torch.finfo(torch.float32).min  # padded query rows: masked with finfo.min everywhere
    return {"none": (None, False), "causal": (None, True), "bool": (keep, False),
            "additive": (torch.zeros(2, 1, seq, seq).masked_fill(~keep, float("-inf")), False), "padded": (padded, False)}


def reference_scores(q, k, mask, causal, scale=None):
    """Σ over query rows of a float64 softmax, rows that may attend nowhere (all masked) dropped."""
    q, k = q.double(), k.double()
    logits = q @ k.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    allowed = torch.ones_like(logits, dtype=torch.bool)
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(torch.float32).min / 2
        allowed = allowed.expand_as(logits)
        if mask.dtype != torch.bool:
            logits = logits + mask.double()  # finite biases count; −∞ and finfo.min rows are dropped below
        logits = logits.masked_fill(~allowed, float("-inf"))
    if causal:
        tri = torch.ones(logits.shape[-2:], dtype=torch.bool).tril()
        allowed = allowed & tri
        logits = logits.masked_fill(~tri, float("-inf"))
    probs = torch.softmax(logits, -1).nan_to_num(0.0) * allowed.any(-1, keepdim=True)
    return probs.sum(-2)


@pytest.mark.parametrize("kind", list(_masks()))
def test_the_fused_route_keeps_the_output_bits_and_the_scores(kind):
    q, k, v = _inputs()
    mask, causal = _masks()[kind]
    fused = sdpa_with_lse(q, k, v, mask, 0.0, causal, None, False, {})
    assert fused is not None, "CPU float32 attention runs the fused flash kernel: the route must be taken"
    assert torch.equal(fused[0].nan_to_num(),
                       F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).nan_to_num())
    with_lse = attention_statistics(q, k, mask, causal, lse=fused[1]).scores
    reference = reference_scores(q, k, mask, causal)
    assert ((with_lse.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5
    softmax_route = attention_statistics(q, k, mask, causal).scores
    assert ((with_lse - softmax_route).abs() / (1 + softmax_route.abs())).max() <= 1e-5


@pytest.mark.parametrize("kind", ["none", "causal", "bool"])
def test_bfloat16_inputs_stay_within_1e_5_of_a_float32_computation_from_the_same_inputs(kind):
    """A bf16 model: the kernel's own lse from bf16 inputs missed 1e-5 on AVX2 (measured up to 3.6e-5 here; about
    1e-6 on torch's portable kernels — it depends on the CPU), so the fused route declines bf16 everywhere and the
    scores come from a float32 softmax of the same bf16 inputs."""
    q, k, v = _inputs(torch.bfloat16)
    mask, causal = _masks()[kind]
    assert sdpa_with_lse(q, k, v, mask, 0.0, causal, None, False, {}) is None
    reference = reference_scores(q.float(), k.float(), mask, causal)
    got = attention_statistics(q, k, mask, causal).scores
    assert ((got.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5


def test_bfloat16_values_are_exact_in_tf32():
    """Why TF32 may form q·kᵀ of a bf16 model on a GPU: every bf16 value (8-bit significand) survives rounding to
    TF32 (11-bit significand) unchanged, so each product is exact and only the fp32 accumulation rounds."""
    values = torch.randn(100_000, generator=torch.Generator().manual_seed(0)).bfloat16().float()
    bits = values.view(torch.int32)
    tf32 = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)  # round to nearest 10 explicit mantissa bits
    assert torch.equal(tf32, values)


@pytest.mark.parametrize("causal", [False, True])
def test_grouped_kv_heads_keep_the_output_bits_on_the_fused_route(causal):
    q, k, v = _inputs(heads=6)
    k, v = k[:, :2].contiguous(), v[:, :2].contiguous()
    fused = sdpa_with_lse(q, k, v, None, 0.0, causal, None, True, {})
    assert fused is not None
    assert torch.equal(fused[0], F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))
    got = attention_statistics(q, k, None, causal, lse=fused[1]).scores
    reference = reference_scores(q, k.repeat_interleave(3, 1), None, causal)
    assert ((got.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5


@pytest.mark.parametrize("change", ["dropout", "gqa", "kwargs"])
def test_the_fused_route_declines_what_it_cannot_reproduce(change):
    q, k, v = _inputs()
    args = dict(dropout_p=0.0, enable_gqa=False, kwargs={})
    if change == "dropout":
        args["dropout_p"] = 0.1
    elif change == "gqa":  # fewer KV heads without enable_gqa: SDPA itself would refuse; leave it to SDPA
        k, v = k[:, :2], v[:, :2]
    else:
        args["kwargs"] = {"something": 1}
    assert sdpa_with_lse(q, k, v, None, args["dropout_p"], False, None, args["enable_gqa"], args["kwargs"]) is None


def _key_only_masks(seq=96):
    g = torch.Generator().manual_seed(2)
    keep = torch.rand(2, 1, 1, seq, generator=g) > 0.2
    bias = torch.zeros(2, 1, 1, seq).masked_fill(~keep, float("-inf"))
    bias[..., 3] = 4.0  # a key every query is pushed towards (the stand-in's sink bias)
    return {"none": (None, False), "causal": (None, True), "key_bool": (keep, False), "key_bias": (bias, False)}


@pytest.mark.parametrize("kind", list(_key_only_masks()))
def test_column_sums_from_the_transposed_log_sum_exp_match_float64(kind, monkeypatch):
    """The fast route: s_j read as the log-sum-exp of the transposed attention, from a second fused call."""
    import sinklib.attention_math as math_module

    q, k, v = _inputs(seq=160)
    mask, causal = _key_only_masks(160)[kind]
    fused = sdpa_with_lse(q, k, v, mask, 0.0, causal, None, False, {})
    taken = []
    original = math_module._statistics_by_transposed_lse
    monkeypatch.setattr(math_module, "_statistics_by_transposed_lse", lambda *a: taken.append(1) or original(*a))
    monkeypatch.setattr(math_module, "TRANSPOSED_ROUTE_MIN_ELEMENTS", 0)  # small calls take the one-block route
    stats = attention_statistics(q, k, mask, causal, lse=fused[1], want_last_row=True)
    assert taken, "a key-only or causal call with the kernel's lse takes the transposed route"
    reference = reference_scores(q, k, mask, causal)
    assert ((stats.scores.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5
    slow = attention_statistics(q, k, mask, causal, want_last_row=True, chunk_size=7)  # the chunked softmax route
    torch.testing.assert_close(stats.last_row, slow.last_row, atol=1e-6, rtol=1e-5)
    assert torch.equal(stats.key_valid, slow.key_valid) and torch.equal(stats.query_count, slow.query_count)


@pytest.mark.parametrize("kv_heads", [4, 2])
# Head dim 128 (scale 1/sqrt(128), not a power of two) at logits of a few units only: from lse ≈ 24 its kernel lse
# is not trusted and the softmax is recomputed instead (the test after the next).
@pytest.mark.parametrize(("head_dim", "logit_size"), [(64, 1.0), (64, 10.0), (128, 1.0)],
                         ids=["logits of a few units", "logits above 80", "head dim 128"])
def test_causal_column_sums_by_blocks_of_rows_match_float64(kv_heads, logit_size, head_dim, monkeypatch):
    """A causal call from BLOCKWISE_ROUTE_MIN_QUERIES rows (head dim ≥ 64) takes its column sums from blocks of
    rows (scale·q·kᵀ − lse in one matmul, exp and a row sum), at logits whose exp alone would overflow float32
    too, with q in the layout a model hands over ([B, S, H, D] memory seen as [B, H, S, D]). (Key masks on this
    route: the masked causal route's test at S = 600.)"""
    import sinklib.attention_math as math_module

    seq = 600  # above the threshold, not a multiple of the block
    q, k, v = _inputs(seq=seq, dim=head_dim)
    q = (q * logit_size).transpose(1, 2).contiguous().transpose(1, 2)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    mask = None
    fused = sdpa_with_lse(q, k, v, mask, 0.0, True, None, kv_heads != 4, {})
    routes = []
    original = math_module._column_sums_by_blocks
    monkeypatch.setattr(math_module, "_column_sums_by_blocks", lambda *a: routes.append(original(*a)) or routes[-1])
    stats = attention_statistics(q, k, mask, True, lse=fused[1], want_last_row=True)
    assert len(routes) == 1 and routes[0] is not None, "the block route ran"
    assert logit_size == 1 or float(fused[1].max()) > 80, "logits large enough that exp(q·kᵀ) overflows"
    reference = reference_scores(q, k.repeat_interleave(4 // kv_heads, 1), mask, True)
    assert ((stats.scores.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5


@pytest.mark.parametrize("causal", [True, False], ids=["causal (block route)", "bidirectional (lse route)"])
def test_at_head_dim_128_a_large_kernel_lse_is_not_trusted_and_the_scores_keep_1e_5(causal):
    """The kernel's float32 lse is off by about 4e-7 × lse; at head dim 128 and lse ≈ 45 (a peaked sink head) the
    scores from it left 1e-5 of float64 (1.2e-5 measured). Such a call recomputes its softmax instead, and keeps
    parity; the masked causal route keeps its one masked call's output and recomputes the statistics."""
    from sinklib.attention_math import LSE_TRUSTED_MAX, trusted_lse
    from sinklib.key_masking import mask_keys, masked_causal_route

    q, k, v = _inputs(seq=512, dim=128)
    q, k = q * 1.5, k * 1.5  # _inputs are × 2 already: logits of std ≈ 9, lse ≈ 45
    _, lse = sdpa_with_lse(q, k, v, None, 0.0, causal, None, False, {})
    assert float(lse.max()) > LSE_TRUSTED_MAX and trusted_lse(lse, 128) is None and trusted_lse(lse, 64) is lse
    stats = attention_statistics(q, k, None, causal, lse=lse, want_last_row=True)
    reference = reference_scores(q, k, None, causal)
    assert ((stats.scores.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5
    if causal:  # masking keys: the masked call's output stands, its statistics are recomputed, and parity holds
        key_mask = torch.zeros(2, 4, 512, dtype=torch.bool)
        key_mask[:, :, 0], key_mask[1, 2, 1:4], key_mask[0, :, 100] = True, True, True
        output, stats = masked_causal_route(q, k, v, key_mask, None, False)
        allowed = mask_keys(None, True, key_mask, 512)
        probs = (q.double() @ k.double().transpose(-1, -2) / 128 ** 0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
        assert ((stats.scores.double() - probs.sum(-2)).abs() / (1 + probs.sum(-2))).max() <= 1e-5
        torch.testing.assert_close(stats.last_row.double(), probs[:, :, -1], atol=1e-6, rtol=1e-5)
        # the output is the model's float32 arithmetic (at these logits 5e-5 from float64 by any kernel): the same
        # as the full-mask call's
        torch.testing.assert_close(output, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
        moderate = _inputs(seq=512, dim=128)  # lse ≈ 15: the kernel's lse is used, and parity holds with it
        _, small_lse = sdpa_with_lse(*moderate, None, 0.0, True, None, False, {})
        assert trusted_lse(small_lse, 128) is small_lse
        assert masked_causal_route(*moderate, torch.zeros(2, 4, 512, dtype=torch.bool), None, False) is not None


def test_a_row_with_no_keys_sends_the_call_to_the_fused_route():
    from sinklib.attention_math import _column_sums_by_blocks

    q, k, _ = _inputs(seq=600, dim=64)
    lse = torch.zeros(2, 4, 600)
    assert _column_sums_by_blocks(q, k, lse, 0.125) is not None
    lse[1, 2, 7] = float("-inf")
    assert _column_sums_by_blocks(q, k, lse, 0.125) is None


@pytest.mark.parametrize("seq", [160, 600])
def test_gradients_flow_through_masking_keys_of_a_causal_call(seq):
    """Capture under autograd: the masked route's output (dead rows restored) has the full-mask route's gradient."""
    from sinklib.key_masking import mask_keys, masked_causal_route

    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 3, seq, 64, generator=g, requires_grad=True) for _ in range(3))
    key_mask = torch.zeros(1, 3, seq, dtype=torch.bool)
    key_mask[:, :, 0] = True  # a first-token sink: row 0 is left with nothing and keeps its own row
    output, _ = masked_causal_route(q, k, v, key_mask, None, False)
    output.square().sum().backward()
    routed = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_keys(None, True, key_mask, seq))
    full.square().sum().backward()
    for got, want in zip(routed, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kind", ["none", "causal", "bool"])
def test_on_a_gpu_bfloat16_scores_from_the_tf32_recompute_stay_within_1e_5_of_float32(kind):
    """The GPU path (TF32 q·kᵀ from bf16 inputs): within 1e-5 of a float64 computation from the same bf16 inputs."""
    q, k, _ = _inputs(torch.bfloat16, seq=256, dim=64)
    mask, causal = _masks(256)[kind]
    reference = reference_scores(q.float(), k.float(), mask, causal)
    got = attention_statistics(q.cuda(), k.cuda(), None if mask is None else mask.cuda(), causal).scores.cpu()
    assert ((got.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5


@pytest.mark.parametrize("seq", [100, 600], ids=["the fused route", "column sums by blocks"])
@pytest.mark.parametrize("kv_heads", [9, 3])
@pytest.mark.parametrize("dead_rows", ["none", "in one head", "in every head"])
def test_masking_keys_of_a_causal_call_without_a_full_mask_matches_float64(kv_heads, dead_rows, seq, monkeypatch):
    """Masked causal attention from the fused kernel with one additive key row: output, column sums and the last
    row against a float64 softmax under the full mask mask_keys builds — rows whose every visible key is masked
    (a head's prefix before its first unmasked key) keep their own row, as mask_keys says."""
    import sinklib.attention_math as math_module
    from sinklib.key_masking import mask_keys, masked_causal_route

    routes = []
    original = math_module._column_sums_by_blocks
    monkeypatch.setattr(math_module, "_column_sums_by_blocks", lambda *a: routes.append(original(*a)) or routes[-1])
    g = torch.Generator().manual_seed(3)
    batch, heads, dim = 2, 9, 64
    q, k, v = (torch.randn(batch, h, seq, dim, generator=g) for h in (heads, kv_heads, kv_heads))
    key_mask = torch.zeros(batch, heads, seq, dtype=torch.bool)
    key_mask[:, :, 5] = True
    key_mask[1, :, 10:20] = True
    if dead_rows == "in one head":
        key_mask[0, 2, :3] = True
        key_mask[1, :, 1] = True  # before batch 0's dead rows end, but seen by no row of batch 1: not a valid key
    elif dead_rows == "in every head":  # a first-token sink masked: row 0 keeps its own row in every head
        key_mask[:, :, 0] = True
    output, stats = masked_causal_route(q, k, v, key_mask, None, kv_heads != heads)
    assert [r is not None for r in routes] == ([True] if seq >= math_module.BLOCKWISE_ROUTE_MIN_QUERIES else [])
    allowed = mask_keys(None, True, key_mask, seq)
    keys, values = (t.repeat_interleave(heads // kv_heads, 1).double() for t in (k, v))
    probs = (q.double() @ keys.transpose(-1, -2) / dim ** 0.5).masked_fill(~allowed, float("-inf")).softmax(-1)
    reference = probs.sum(-2)
    assert ((stats.scores.double() - reference).abs() / (1 + reference.abs())).max() <= 1e-5
    torch.testing.assert_close(output.double(), probs @ values, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(stats.last_row.double(), probs[:, :, -1], atol=1e-6, rtol=1e-5)
    slow = attention_statistics(q, k, allowed, False, None, want_last_row=True)  # the full-mask route's bookkeeping
    assert torch.equal(stats.key_valid, slow.key_valid) and torch.equal(stats.query_count, slow.query_count)


def test_a_live_row_beside_a_dead_one_adds_nothing_even_where_its_masked_key_dominates():
    """Dead rows in one head only: the other head's live row has a masked key far above everything it may still
    see, so exp(logit − its masked lse) overflows. Its share must be zero, not ∞·0 = NaN."""
    from sinklib.key_masking import mask_keys, masked_causal_route

    q, k = torch.zeros(1, 2, 4, 16), torch.zeros(1, 2, 4, 16)
    q[0, 0, 1, 0] = k[0, 0, 1, 0] = 20.0  # head 0, row 1 attends to key 1 with logit 100
    v = torch.randn(1, 2, 4, 16, generator=torch.Generator().manual_seed(0))
    key_mask = torch.zeros(1, 2, 4, dtype=torch.bool)
    key_mask[0, 0, 1] = True  # head 0: key 1 masked, row 1 still sees key 0 (live)
    key_mask[0, 1, :2] = True  # head 1: rows 0 and 1 see only masked keys (dead)
    output, stats = masked_causal_route(q, k, v, key_mask, None, False)
    allowed = mask_keys(None, True, key_mask, 4)
    probs = (q.double() @ k.double().transpose(-1, -2) / 4).masked_fill(~allowed, float("-inf")).softmax(-1)
    torch.testing.assert_close(stats.scores.double(), probs.sum(-2), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(stats.scores[0, 0], torch.tensor([2.5 + 1 / 3, 0.0, 0.5 + 1 / 3, 1 / 3]))
    torch.testing.assert_close(output.double(), probs @ v.double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_heads", [9, 3])
@pytest.mark.parametrize("mask_kind", ["none", "padded"])
def test_a_decoding_row_matches_float64_and_the_general_route_bit_for_bit(kv_heads, mask_kind, monkeypatch):
    """One query row, as every decoding step of a KV-cache generation sends it (SmolLM2's 9 heads on 3 or 9 KV
    heads): the scores are its softmax, within 1e-6 of float64; and the short route taken when there is no mask
    gives the same bits as the general one (which a map request takes), so traces are the same whichever ran."""
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 9, 1, 64, generator=g) * 2, torch.randn(2, kv_heads, 70, 64, generator=g) * 2
    mask = None
    if mask_kind == "padded":
        mask = torch.zeros(2, 1, 1, 70)
        mask[1, ..., :12] = torch.finfo(torch.float32).min
    general = attention_math._chunk_logits
    if mask is None:  # the short route must be the one that runs
        monkeypatch.setattr(attention_math, "_chunk_logits", lambda *a: pytest.fail("took the general route"))
    stats = attention_statistics(q, k, mask, False, 0.125)
    monkeypatch.setattr(attention_math, "_chunk_logits", general)
    expected = reference_scores(q, k.repeat_interleave(9 // kv_heads, dim=1), mask, False, 0.125)
    assert (stats.scores.double() - expected).abs().max() < 1e-6
    with_map = attention_statistics(q, k, mask, False, 0.125, map_heads=(4,))
    assert torch.equal(stats.scores, with_map.scores) and torch.equal(with_map.maps[4][:, 0], stats.scores[:, 4])
    assert stats.query_count.tolist() == [1.0, 1.0]
    assert stats.key_valid.tolist() == [[True] * 70, [False] * 12 + [True] * 58] if mask is not None else \
        stats.key_valid.all()


def test_decoding_rows_scored_together_have_each_rows_own_bits():
    """The rows of a decoding step's layers, copied in as their calls run and scored in one batched matmul and
    softmax at the step's end, give each row the bits the general route gives it alone (head dim 48: a scale that
    is not a power of two), within 1e-6 of float64; what a model writes into its tensors afterwards cannot reach
    them."""
    g = torch.Generator().manual_seed(5)
    queries = [torch.randn(2, 6, 1, 48, generator=g) * 2 for _ in range(5)]
    keys = [torch.randn(2, 3, 37, 48, generator=g) * 2 for _ in range(5)]
    scale = 1 / math.sqrt(48)
    expected = [reference_scores(q, k.repeat_interleave(2, dim=1), None, False, scale) for q, k in zip(queries, keys)]
    alone = [attention_statistics(q, k, None, False, scale, map_heads=(0,)).scores for q, k in zip(queries, keys)]
    rows = attention_math.DecodingRows()
    for q, k in zip(queries, keys):
        rows.add(q, k)
        q.mul_(3.0), k.zero_()  # the model's tensors, changed after the call: the copies keep what it attended to
    together = rows.scores(scale)
    assert together.shape == (5, 2, 6, 37)
    for scores, by_itself, reference in zip(together, alone, expected):
        assert torch.equal(scores, by_itself)
        assert (scores.double() - reference).abs().max() < 1e-6


def test_a_call_with_no_query_rows_gives_empty_statistics_not_an_error():
    """Zero query rows (an empty chunk of a caller's) with the kernel's lse: nothing attended, no last row."""
    q, k = torch.zeros(1, 2, 0, 16), torch.randn(1, 2, 5, 16)
    stats = attention_statistics(q, k, None, False, None, lse=torch.zeros(1, 2, 0), want_last_row=True)
    assert torch.equal(stats.scores, torch.zeros(1, 2, 5)) and stats.query_count.tolist() == [0.0]
    assert not stats.key_valid.any() and stats.last_row is None
