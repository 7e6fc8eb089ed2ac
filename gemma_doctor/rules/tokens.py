"""Vocabulary and BOS/EOS pitfalls (GD505, GD90x), from tokenizer_config.json, generation_config.json and the
safetensors headers: an embedding shorter than the tokenizer, a chat model that never stops, EOS masked out of
the loss, a doubled <bos>. Measured in docs/findings.md."""

from __future__ import annotations

from typing import Any, Iterator

from gemma_doctor.codes import emits
from gemma_doctor.facts import CheckOptions, Environment, ModelFacts
from gemma_doctor.readers.tokenizer import FILE as TOKENIZER_CONFIG
from gemma_doctor.report import Finding, Severity
from gemma_doctor.rules.common import text_config, train_tied_embedding, run_trainer
from gemma_doctor.stack import Exposure
from gemma_doctor.versioning import TRL_CONVERSATIONAL_DOUBLE_BOS

END_OF_TURN = "<end_of_turn>"


def embedding_rows(model: ModelFacts) -> tuple[str, str, int] | None:
    """(file, tensor, rows) of the input embedding in the safetensors headers (not Gemma 3n's per-layer one)."""
    census = model.census
    if census is None:
        return None
    for header in census.headers:
        for t in header.tensors:
            if t.name.endswith("embed_tokens.weight") and "per_layer" not in t.name and len(t.shape) == 2:
                return header.path.name, t.name, t.shape[0]
    return None


@emits("GD505", "GD901", "GD902", "GD903")
def check(model: ModelFacts, env: Environment, options: CheckOptions) -> Iterator[Finding]:
    """GD505 and GD901-GD903 for a Gemma model whose tokenizer_config.json was read."""
    tok = model.tokenizer
    if not model.family.is_gemma or tok is None or not tok.ok:
        return
    yield from _rows(model, tok, env)
    yield from _eos(model, tok)
    yield from _pad(model, env, tok)
    yield from _bos(model, env, tok)


def _rows(model: ModelFacts, tok: Any, env: Environment) -> Iterator[Finding]:
    top = tok.max_added_id
    found = embedding_rows(model)
    if top is None or found is None:
        return
    file, tensor, rows = found
    if top < rows:
        return
    beyond = sorted((i, t) for t, i in tok.added.items() if i >= rows)
    shown = ", ".join(f"{t} ({i})" for i, t in beyond[:5]) + (f" and {len(beyond) - 5} more" if len(beyond) > 5 else "")
    audio = _audio_offset(model)
    message = (f"{TOKENIZER_CONFIG} has tokens up to id {top}, but {tensor} has {rows} rows: {len(beyond)} added "
               f"token(s) have no embedding ({shown}); the first batch holding one fails with \"IndexError: index out "
               "of range in self\" (on a GPU: a device-side assert). The tokenizer was saved after adding tokens, the "
               "model was not resized")
    fix = ("model.resize_token_embeddings(len(tokenizer)) before training, and save the model with the tokenizer; "
           "train the new rows (resizing starts them all equal): " + train_tied_embedding(env.libraries))
    if audio is not None:
        # Gemma3nModel embeds every id >= audio_config.vocab_offset with embed_audio (modeling_gemma3n.py 5.23.0:
        # `audio_mask = input_ids >= self.embed_audio.vocab_offset`), whatever the text embedding's rows: resizing
        # cannot give an added token a row there. Reproduced: Gemma3nMultimodalEmbedder raises IndexError for such an
        # id, and a resized Gemma3nForCausalLM embeds it.
        message += (f"; and on this Gemma 3n, resizing does not help: {model.family.display_name} routes every id >= "
                    f"audio_config.vocab_offset ({audio}) to its audio embedder (embed_audio), which has no row for it")
        fix = ("do not add tokens to the multimodal Gemma 3n: map the new strings onto ids the tokenizer already has "
               "(below the vision offset), or, for text-only training, load Gemma3nForCausalLM (no audio routing) "
               "and model.resize_token_embeddings(len(tokenizer)) there")
    yield Finding(
        "GD505", Severity.ERROR, message, file=file, key=tensor, fix=fix,
        details={"rows": rows, "max_token_id": top, "tokens_without_rows": [t for _, t in beyond[:50]],
                 **({"audio_vocab_offset": audio} if audio is not None else {})})


# transformers' Gemma3nAudioConfig.vocab_offset default: the text vocabulary (262,144) + the vision one (128).
GEMMA3N_AUDIO_OFFSET = 262_272


def _audio_offset(model: ModelFacts) -> int | None:
    """The first id a multimodal Gemma 3n embeds with its audio embedder; None for any other model."""
    if model.family.model_type != "gemma3n" or not model.config.ok or not isinstance(model.config.data, dict):
        return None
    audio = model.config.data.get("audio_config")
    offset = audio.get("vocab_offset") if isinstance(audio, dict) else None
    return offset if isinstance(offset, int) and not isinstance(offset, bool) else GEMMA3N_AUDIO_OFFSET


def _eos_ids(model: ModelFacts) -> tuple[set[int] | None, str, str]:
    """The ids generate() stops at, and (file, key) they come from: generation_config.json, else config.json."""
    gen = model.generation_config
    if gen.ok and "eos_token_id" in gen.data:
        return _ids(gen.data["eos_token_id"]), "generation_config.json", "eos_token_id"
    if gen.ok or not gen.exists:
        text = text_config(model)
        for scope, prefix in ((model.config.data if model.config.ok else {}, ""), (text, "text_config.")):
            if "eos_token_id" in scope:
                return _ids(scope["eos_token_id"]), "config.json", prefix + "eos_token_id"
    return None, "generation_config.json", "eos_token_id"


def _ids(value: Any) -> set[int] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return {value}
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return set(value)
    return None


def _eos(model: ModelFacts, tok: Any) -> Iterator[Finding]:
    turn = tok.id_of(END_OF_TURN)
    # Only a chat checkpoint (its template ends turns with <end_of_turn>) is meant to stop there.
    if turn is None or not tok.has_chat_template:
        return
    ids, file, key = _eos_ids(model)
    if ids is None or turn in ids:
        return
    want = sorted(ids | {turn})
    yield Finding(
        "GD901", Severity.WARNING,
        f"{file} {key} is {sorted(ids)} but the chat template ends every turn with {END_OF_TURN} (id {turn}): "
        "generate() never stops at the end of an answer and runs to max_new_tokens"
        + (" (107 is Gemma 2's <end_of_turn>; in Gemma 3 it is a newline)" if turn == 106 and 107 in ids else ""),
        file=file, key=key, fix=f"set \"eos_token_id\": {want} in {file} (model.generation_config.eos_token_id = "
                                f"{want} before save_pretrained: setting model.config alone is not saved there)",
        details={"eos_token_id": sorted(ids), "end_of_turn_id": turn})


def _pad(model: ModelFacts, env: Environment, tok: Any) -> Iterator[Finding]:
    tc = env.training_config
    setting = tc.get("pad_token") if tc is not None and tc.ok else None
    pad, where, key = tok.pad_token, TOKENIZER_CONFIG, "pad_token"
    if setting is not None and isinstance(setting.value, str):
        pad, where, key = setting.value, tc.path, setting.key
    if pad is None or tok.eos_token is None or pad != tok.eos_token:
        return
    yield Finding(
        "GD902", Severity.WARNING,
        f"the pad token is the EOS token ({pad}): transformers' DataCollatorForLanguageModeling sets every pad id's "
        "label to -100, so every EOS is masked out of the loss too and the model never learns to stop",
        file=str(where), key=key,
        fix="keep Gemma's own <pad> (id 0) as the pad token (tokenizer.pad_token = \"<pad>\"); TRL's own collator "
            "(>= 0.19) pads labels separately and is not affected", details={"pad_token": pad, "eos_token": tok.eos_token})


def _bos(model: ModelFacts, env: Environment, tok: Any) -> Iterator[Finding]:
    tc = env.training_config
    if tc is None or not tc.ok or not tok.template_emits_bos or tok.add_bos_token is False:
        return
    trl = env.libraries.get("trl")
    # TRL's own data preparation adds the second <bos>: only where one of TRL's trainers runs the loop.
    old_trl = run_trainer(model, env).value.runs_trl \
        and env.libraries.exposure(TRL_CONVERSATIONAL_DOUBLE_BOS) is Exposure.AFFECTED
    yield Finding(
        "GD903", Severity.WARNING if old_trl else Severity.INFO,
        "the chat template writes <bos> itself and the tokenizer adds another: text rendered with "
        "apply_chat_template(tokenize=False) and tokenized again (a pre-rendered \"text\" column, in every TRL) starts "
        "with two <bos>" + (f"; {trl.describe()} does this to conversational datasets too (fixed in TRL 0.17.0)"
                            if old_trl else ""),
        file=TOKENIZER_CONFIG, key="chat_template",
        fix="tokenize rendered text with add_special_tokens=False, or give the trainer messages (conversational "
            "data) rather than rendered text" + ('; pip install "trl>=0.17.0"' if old_trl else ""),
        details={"add_bos_token": tok.add_bos_token, "trl": trl.to_json()})
