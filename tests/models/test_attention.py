"""posttrain_sdpa: packed rows attended per sequence, exactly as if each sequence ran alone; otherwise sdpa."""

import pytest
import torch
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from trainer_lib.data.preference_batches import collate_pairs, model_inputs
from trainer_lib.models.attention import NAME, forward_bounds, packed_sdpa, register, sequence_bounds

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def tiny(model_type: str, attention: str, **extra):
    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, **{**SMALL, **extra})
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()


def packed_row(lengths):
    ids = torch.randint(3, 97, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids, positions


def plain(lengths) -> dict:
    ids, positions = packed_row(lengths)
    return {"input_ids": ids, "position_ids": positions}


def flash_kwargs(lengths) -> dict:
    """What a caller that knows the boundaries passes (DPO's ``model_inputs``; transformers' flattening collator)."""
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "cu_seq_lens_q": bounds,
        "cu_seq_lens_k": bounds,
        "max_length_q": max(lengths),
        "max_length_k": max(lengths),
    }


# --------------------------------------------------------------------------- the path before: read in every layer

REFERENCE = "posttrain_sdpa_per_layer"


def per_layer_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """posttrain_sdpa before this change, verbatim: the boundaries found in every layer (nonzero, tolist)."""
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def sequence_starts(position_ids) -> list[int]:
        row = position_ids[0]
        follows = torch.ones_like(row, dtype=torch.bool)
        follows[1:] = row[1:] == row[:-1] + 1
        follows[0] = False
        return torch.nonzero(~follows).flatten().tolist()

    position_ids = kwargs.get("position_ids")
    n = query.shape[2]
    packed = (
        attention_mask is None
        and position_ids is not None
        and query.shape[0] == 1
        and n > 1
        and key.shape[2] == n
        and not getattr(module, "sliding_window", None)
    )
    starts = sequence_starts(position_ids) if packed else []
    if len(starts) <= 1:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    grouped = key.shape[1] != query.shape[1]
    bounds = [*starts, n]
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                query[:, :, a:b],
                key[:, :, a:b],
                value[:, :, a:b],
                dropout_p=dropout,
                is_causal=True,
                scale=scaling,
                enable_gqa=grouped,
            )
            for a, b in zip(bounds[:-1], bounds[1:])
        ],
        dim=2,
    )
    return out.transpose(1, 2).contiguous(), None


def register_reference() -> str:
    register()
    AttentionInterface.register(REFERENCE, per_layer_sdpa)
    AttentionMaskInterface.register(REFERENCE, ALL_MASK_ATTENTION_FUNCTIONS[NAME])
    return REFERENCE


# --------------------------------------------------------------------------- host reads

#: tensor methods that copy a tensor's values to the host, or size their output by them: each a sync on a GPU
READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


class HostReads:
    """Counts host reads while active: in all, and inside the attention function ``attention``, which a model built
    with ``attn_implementation=COUNTED`` calls through :meth:`attend`. The tensor methods are patched rather than
    watched by a ``TorchFunctionMode``, which the backward's recomputation (gradient checkpointing) would escape."""

    active: list["HostReads"] = []

    def __init__(self, attention=packed_sdpa):
        self.attention, self.total, self.in_attention, self.inside = attention, 0, 0, False

    def __enter__(self):
        def counted(read):
            def method(*args, **kwargs):
                self.total += 1
                self.in_attention += self.inside
                return read(*args, **kwargs)

            return method

        targets = [(torch.Tensor, name) for name in READS] + [(torch, "nonzero")]
        self.saved = [(owner, name, vars(owner).get(name)) for owner, name in targets]  # None: inherited
        for owner, name, _ in self.saved:
            setattr(owner, name, counted(getattr(owner, name)))
        HostReads.active.append(self)
        return self

    def __exit__(self, *exc):
        HostReads.active.pop()
        for owner, name, own in self.saved:
            if own is None:
                delattr(owner, name)
            else:
                setattr(owner, name, own)

    def attend(self, *args, **kwargs):
        self.inside = True
        try:
            return self.attention(*args, **kwargs)
        finally:
            self.inside = False


COUNTED = "posttrain_sdpa_counted"


def count_reads(model, inputs: dict, attention=packed_sdpa, backward: bool = False) -> HostReads:
    """Host reads of one forward (and backward) of ``model`` (built with ``COUNTED``) through ``attention``."""
    with HostReads(attention) as reads:
        out = model(**inputs, use_cache=False)
        if backward:
            out.loss.backward()
    return reads


def register_counted() -> str:
    register()
    AttentionInterface.register(COUNTED, lambda *args, **kwargs: HostReads.active[-1].attend(*args, **kwargs))
    AttentionMaskInterface.register(COUNTED, ALL_MASK_ATTENTION_FUNCTIONS[NAME])
    return COUNTED


# --------------------------------------------------------------------------- tests


def test_sequence_bounds_are_where_the_positions_restart():
    assert sequence_bounds(torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1]])) == [0, 3, 5, 6, 8]
    assert sequence_bounds(torch.tensor([[5, 6, 7]])) == [0, 3]  # one sequence, offset (a continuation)


def test_the_bounds_are_read_once_per_tensor_and_again_after_an_in_place_change():
    positions = torch.tensor([[0, 1, 0, 1, 2]])
    with HostReads() as mode:
        assert forward_bounds(None, positions) == forward_bounds(None, positions) == [0, 2, 5]
    assert mode.total == 1
    positions.copy_(torch.tensor([[0, 0, 1, 2, 0]]))
    assert forward_bounds(None, positions) == [0, 1, 4, 5]
    cu = torch.tensor([0, 4, 5], dtype=torch.int32)
    assert forward_bounds(cu, positions) == [0, 4, 5]  # the caller's boundaries win


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "mistral"])
def test_a_packed_row_gives_each_sequence_the_logits_it_gets_alone(model_type):
    register()
    lengths = [7, 1, 12, 5]
    ids, positions = packed_row(lengths)
    model = tiny(model_type, NAME)
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits
        given = model(input_ids=ids, position_ids=positions, use_cache=False, **flash_kwargs(lengths)).logits
        offsets = [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        alone = torch.cat(
            [model(input_ids=ids[:, a:b], use_cache=False).logits for a, b in zip(offsets[:-1], offsets[1:])], dim=1
        )
    assert torch.allclose(packed, alone, atol=1e-5)
    assert torch.equal(given, packed)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
@pytest.mark.parametrize("boundaries", ["position_ids", "cu_seq_lens"])
def test_logits_and_gradients_are_bitwise_those_of_the_per_layer_path(model_type, boundaries):
    """Bitwise, not to a tolerance: the same SDPA calls on the same slices in the same order, so any
    difference at all would mean different boundaries (or a different kernel) reached a layer."""
    lengths = [9, 4, 1, 15]
    ids, positions = packed_row(lengths)
    extra = flash_kwargs(lengths) if boundaries == "cu_seq_lens" else {}
    results = {}
    for attention in (register_reference(), NAME):
        model = tiny(model_type, attention).train()
        out = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False, **extra)
        out.loss.backward()
        results[attention] = (out.logits.detach(), [p.grad for p in model.parameters()])
    assert torch.equal(results[NAME][0], results[REFERENCE][0])
    assert all(torch.equal(a, b) for a, b in zip(results[NAME][1], results[REFERENCE][1], strict=True))


def test_gradients_match_transformers_block_diagonal_sdpa():
    register()
    ids, positions = packed_row([9, 4, 15])
    grads = {}
    for attention in ("sdpa", NAME):
        model = tiny("llama", attention).train()
        loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss
        loss.backward()
        grads[attention] = (loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[NAME][0] == pytest.approx(grads["sdpa"][0], abs=1e-6)
    assert torch.allclose(grads[NAME][1], grads["sdpa"][1], atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_packed_forward_reads_the_host_once_whatever_the_depth(model_type):
    """Before: every layer read the boundaries (nonzero, then tolist). Now the first layer reads them and
    the others, and the recomputation under gradient checkpointing, reuse the list. transformers' own
    mask builder adds one read per forward (it checks that the row is packed), also independent of depth."""
    register_counted()
    lengths = [6, 3, 8]
    reads = {}
    for layers in (2, 4):
        model = tiny(model_type, COUNTED, num_hidden_layers=layers)
        with torch.no_grad():  # fresh tensors for each forward, as each micro-batch has
            reads[layers, "before"] = count_reads(model, plain(lengths), attention=per_layer_sdpa)
            reads[layers, "positions"] = count_reads(model, plain(lengths))
            reads[layers, "cu_seq_lens"] = count_reads(model, {**plain(lengths), **flash_kwargs(lengths)})
        model.train().activation_checkpointing_enable()
        batch = plain(lengths)
        reads[layers, "checkpointed"] = count_reads(model, {**batch, "labels": batch["input_ids"]}, backward=True)
    assert reads[2, "before"].in_attention == 2 * 2 and reads[4, "before"].in_attention == 2 * 4
    for case in ("positions", "cu_seq_lens", "checkpointed"):
        assert reads[2, case].in_attention == reads[4, case].in_attention == 1, case
        assert reads[2, case].total == reads[4, case].total <= 2, case


def test_dpo_model_inputs_carry_the_boundaries_and_change_no_logit():
    register()
    pairs = [
        {"prompt_ids": [5, 6, 7], "chosen_ids": [8, 9], "rejected_ids": [10, 11, 12, 13]},
        {"prompt_ids": [6], "chosen_ids": [7, 7, 7], "rejected_ids": [9]},
    ]
    batch = collate_pairs(pairs, pad_token_id=0, packed=True)
    inputs = model_inputs(batch, "cpu")
    assert inputs["cu_seq_lens_q"].tolist() == [0, 5, 9, 16, 18] and inputs["cu_seq_lens_q"].dtype == torch.int32
    assert inputs["cu_seq_lens_k"] is inputs["cu_seq_lens_q"]
    assert inputs["max_length_q"] == inputs["max_length_k"] == 7
    model = tiny("llama", NAME)
    with torch.no_grad():
        given = model(**inputs, use_cache=False).logits
        found = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"], use_cache=False).logits
    assert torch.equal(given, found)
    padded = model_inputs(collate_pairs(pairs, pad_token_id=0), "cpu")
    assert sorted(padded) == ["attention_mask", "input_ids"]


def test_boundaries_that_do_not_cover_the_row_are_an_error():
    register()
    ids, positions = packed_row([4, 4])
    wrong = {"cu_seq_lens_q": torch.tensor([0, 4, 7], dtype=torch.int32)}
    with pytest.raises(ValueError, match="8 tokens"):
        tiny("llama", NAME)(input_ids=ids, position_ids=positions, use_cache=False, **wrong)


def test_padded_batches_and_generation_are_plain_sdpa():
    register()
    ids = torch.randint(3, 97, (3, 10), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as in generation
    mask[2, :1] = 0
    outputs = {}
    for attention in ("sdpa", NAME):
        model = tiny("llama", attention)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        generated = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0
        )
        outputs[attention] = (logits * mask[..., None], generated)
    assert torch.allclose(outputs[NAME][0], outputs["sdpa"][0], atol=1e-5)
    assert torch.equal(outputs[NAME][1], outputs["sdpa"][1])
