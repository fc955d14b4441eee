"""A character-level tokenizer for the tiny tasks, built locally: one token per character of
``0123456789+= ``, and ``<pad>`` (id 0), ``<eos>`` (id 1), ``<bos>`` (id 2, never added to prompts). A
``transformers`` fast tokenizer; ``decode`` concatenates the characters exactly.
"""

from __future__ import annotations

SPECIALS = ["<pad>", "<eos>", "<bos>"]
CHARS = list("0123456789+= ")
VOCAB = SPECIALS + CHARS
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2


def build_tokenizer(vocab: list[str] = VOCAB):
    """The fast tokenizer (``transformers.PreTrainedTokenizerFast``) of ``vocab``; deterministic.

    Another task passes a vocabulary that extends ``VOCAB`` (the ids above stay the same)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({tok: i for i, tok in enumerate(vocab)}, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<pad>",
        padding_side="left",
        model_max_length=64,
    )
    return tok
