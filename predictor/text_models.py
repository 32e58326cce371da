"""The neural predictor: a small BERT encoder with two heads, trained from scratch on CPU.

Why this shape: AugServe predicts a request's output-length range and its API-call duration
with a lightweight BERT. No pretrained weights can be downloaded here, and a big encoder is not
needed for texts this regular, so the default is a 2-layer, 128-wide `transformers` BERT over
our own tokenizer (server/tokenizer), trained from random weights in about a minute on two
cores. One encoder pass feeds three linear heads: a classifier over the length buckets
(`predictor.buckets`, AugServe's output), a regression of log output tokens (the count sent as
the hint, kept inside the chosen bucket: a bucket alone would answer 41 for every reply of
32-63 tokens) and a regression of log tool seconds, both standardised. A prediction per
request costs one small forward pass (a few milliseconds on CPU).

The pooled vector is the mean of the token states (not the first token's state): with a
from-scratch encoder and a few thousand examples, averaging trains faster and more stably.

A user's own BERT checkpoint (any directory `BertModel.from_pretrained` reads, with its
tokenizer beside it) can replace the random encoder (`NeuralModel.from_pretrained`); the
heads are then trained on our data as usual.

Everything is seeded (`torch.manual_seed`, a `random.Random` for the batch order) and runs with
`torch.use_deterministic_algorithms(True)`, so the same data, seed and thread count give the
same weights.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from transformers import AutoTokenizer, BertConfig, BertModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from common.errors import UserError  # noqa: E402
from predictor.data import TOKENIZER_DIR, load_tokenizer  # noqa: E402

#: Tokens the encoder reads; `request_text` is sized to fit (~100 on average, at most ~160).
MAX_LENGTH = 160

#: The default encoder: small enough to train from scratch in about a minute on two cores.
DEFAULT_ARCH: dict[str, int] = {"hidden_size": 128, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "intermediate_size": 256}

HEADS_FILE = "heads.safetensors"
ENCODER_DIR = "encoder"


class CheckpointError(UserError):
    """A checkpoint directory the user gave (`harness predictor train --init`) that cannot be
    started from; the message says what is wrong with it."""


@dataclass
class TrainConfig:
    """Training settings; the defaults are the ones the figures in the README were made with.

    lr 2e-3 with 6 % linear warm-up then linear decay: from random weights a small encoder
    needs a larger step than fine-tuning would use; `duration_weight` balances the two losses
    (cross-entropy over 9 buckets vs. squared error of standardised log seconds).
    `threads` 1: float sums then happen in one order on every machine (the same seed gives the
    same weights everywhere), and on a shared two-core machine a second thread mostly waits
    for the other programs (we measured a step 2-3x slower with 2 threads than with 1 there).
    """

    epochs: int = 8
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: float = 0.06
    duration_weight: float = 1.0
    seed: int = 0
    threads: int = 1


@dataclass(frozen=True)
class Item:
    """One training row: a text with a bucket label (-1: none), standardised log tokens and
    log seconds (nan: none). Request texts carry all three, call texts only seconds."""

    text: str
    bucket: int
    tokens: float
    seconds: float


class Heads(nn.Module):
    def __init__(self, encoder: BertModel, n_buckets: int) -> None:
        super().__init__()
        self.encoder = encoder
        hidden = encoder.config.hidden_size
        self.dropout = nn.Dropout(encoder.config.hidden_dropout_prob)
        self.bucket_head = nn.Linear(hidden, n_buckets)
        self.tokens_head = nn.Linear(hidden, 1)
        self.seconds_head = nn.Linear(hidden, 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        states = self.encoder(input_ids=input_ids, attention_mask=attention_mask
                              ).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        pooled = self.dropout(pooled)
        return (self.bucket_head(pooled), self.tokens_head(pooled).squeeze(-1),
                self.seconds_head(pooled).squeeze(-1))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with `n` intra-op threads, then restore the process's setting.

    Why: on a busy two-core machine a forward pass of this small model took 70-180 ms with
    two threads (they wait for each other) and ~4 ms with one; the harness calls the predictor
    once per request from its event loop, so one thread is both faster and less disruptive.
    """
    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if before != n:
            torch.set_num_threads(before)


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """Deterministic kernels while training, restored afterwards (the flag is global)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


class NeuralModel:
    """Encoder + heads + tokenizer, and the log-seconds standardisation."""

    def __init__(self, net: Heads, tokenizer: Any, max_length: int,
                 seconds_mean: float = 0.0, seconds_std: float = 1.0,
                 tokens_mean: float = 0.0, tokens_std: float = 1.0) -> None:
        self.net = net
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.seconds_mean = seconds_mean
        self.seconds_std = seconds_std
        self.tokens_mean = tokens_mean
        self.tokens_std = tokens_std
        #: intra-op threads for `predict` (see `torch_threads`)
        self.threads = 1
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.net.eval()

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def new(cls, n_buckets: int, seed: int = 0, arch: dict[str, int] | None = None,
            tokenizer_dir: str | os.PathLike[str] = TOKENIZER_DIR) -> NeuralModel:
        """A randomly initialised encoder over our tokenizer (seeded)."""
        tokenizer = load_tokenizer(str(tokenizer_dir))
        config = BertConfig(vocab_size=len(tokenizer), max_position_embeddings=MAX_LENGTH,
                            type_vocab_size=1, pad_token_id=tokenizer.pad_token_id or 0,
                            **(arch or DEFAULT_ARCH))
        torch.manual_seed(seed)
        encoder = BertModel(config, add_pooling_layer=False)
        return cls(Heads(encoder, n_buckets), tokenizer, MAX_LENGTH)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], n_buckets: int,
                        seed: int = 0) -> NeuralModel:
        """A user's BERT checkpoint directory (config + weights, tokenizer beside them; without
        a tokenizer, ours is used if the vocabularies match) with new, seeded heads."""
        p = Path(path)
        if not (p / "config.json").is_file():
            raise CheckpointError(f"{p}: not a checkpoint directory (no config.json)")
        config = BertConfig.from_pretrained(str(p))
        if config.model_type != "bert":
            raise CheckpointError(f"{p}: a {config.model_type!r} checkpoint; only BERT is "
                                  "supported")
        has_tokenizer = any((p / f).is_file() for f in ("tokenizer.json", "vocab.txt",
                                                        "tokenizer_config.json"))
        tokenizer = AutoTokenizer.from_pretrained(str(p)) if has_tokenizer else load_tokenizer()
        if len(tokenizer) > config.vocab_size:
            raise CheckpointError(f"{p}: the tokenizer has {len(tokenizer)} tokens but the "
                                  f"encoder only {config.vocab_size} embeddings")
        torch.manual_seed(seed)
        encoder = BertModel.from_pretrained(str(p), add_pooling_layer=False)
        net = Heads(encoder, n_buckets)
        return cls(net, tokenizer, min(MAX_LENGTH, config.max_position_embeddings))

    # -- text to tensors -------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(texts), truncation=True, max_length=self.max_length,
                              add_special_tokens=True)["input_ids"]

    def _batch(self, ids: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, x in enumerate(ids):
            input_ids[row, :len(x)] = torch.tensor(x, dtype=torch.long)
            mask[row, :len(x)] = 1
        return input_ids, mask

    # -- training --------------------------------------------------------------------------
    def fit(self, items: Sequence[Item], config: TrainConfig,
            progress: Callable[[dict[str, Any]], None] | None = None) -> list[float]:
        """Train on `items`; returns the mean loss of each epoch. `progress` gets a dict after
        every batch (epoch, epochs, step, steps, loss, epoch_done) so a caller can draw a bar."""
        ids = self.encode([it.text for it in items])
        buckets = torch.tensor([it.bucket for it in items], dtype=torch.long)
        tokens = torch.tensor([it.tokens for it in items], dtype=torch.float32)
        seconds = torch.tensor([it.seconds for it in items], dtype=torch.float32)
        rng = random.Random(config.seed)
        steps_per_epoch = math.ceil(len(items) / config.batch_size)
        total = steps_per_epoch * config.epochs
        warm = max(1, int(config.warmup * total))
        torch.manual_seed(config.seed)
        decay = [p for n, p in self.net.named_parameters()
                 if p.ndim >= 2 and "LayerNorm" not in n]
        no_decay = [p for n, p in self.net.named_parameters()
                    if not (p.ndim >= 2 and "LayerNorm" not in n)]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=config.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min((s + 1) / warm, max(0.0, (total - s) / max(1, total - warm))))
        losses = []
        self.net.train()
        step = 0
        with torch_threads(max(1, config.threads)), deterministic():
            for epoch in range(config.epochs):
                epoch_loss, seen = 0.0, 0
                batches = list(self._batches(ids, config.batch_size, rng))
                for k, batch in enumerate(batches):
                    input_ids, mask = self._batch([ids[i] for i in batch])
                    index = torch.tensor(batch, dtype=torch.long)
                    logits, pred_t, pred_s = self.net(input_ids, mask)
                    loss = self._loss(logits, pred_t, pred_s, buckets[index], tokens[index],
                                      seconds[index], config.duration_weight)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    step += 1
                    epoch_loss += loss.item() * len(batch)
                    seen += len(batch)
                    if progress is not None:
                        progress({"epoch": epoch + 1, "epochs": config.epochs, "step": step,
                                  "steps": total, "loss": epoch_loss / seen,
                                  "epoch_done": k == len(batches) - 1})
                losses.append(epoch_loss / max(1, seen))
        self.net.eval()
        return losses

    @staticmethod
    def _batches(ids: Sequence[Sequence[int]], size: int, rng: random.Random
                 ) -> Iterator[list[int]]:
        """Shuffled batches of similar lengths: shuffle, sort chunks of 20 batches by length,
        cut, shuffle the batches. Padding is what costs time on CPU, and request texts
        (~150 tokens) and call texts (~30) mixed in one batch would mostly be padding."""
        order = list(range(len(ids)))
        rng.shuffle(order)
        chunk = size * 20
        batches = []
        for start in range(0, len(order), chunk):
            part = sorted(order[start:start + chunk], key=lambda i: len(ids[i]))
            batches += [part[i:i + size] for i in range(0, len(part), size)]
        rng.shuffle(batches)
        yield from batches

    @staticmethod
    def _loss(logits: torch.Tensor, pred_t: torch.Tensor, pred_s: torch.Tensor,
              buckets: torch.Tensor, tokens: torch.Tensor, seconds: torch.Tensor,
              duration_weight: float) -> torch.Tensor:
        loss = logits.new_zeros(())
        has_bucket = buckets >= 0
        if bool(has_bucket.any()):
            loss = loss + nn.functional.cross_entropy(logits[has_bucket], buckets[has_bucket])
        has_t = ~torch.isnan(tokens)
        if bool(has_t.any()):
            loss = loss + nn.functional.mse_loss(pred_t[has_t], tokens[has_t])
        has_s = ~torch.isnan(seconds)
        if bool(has_s.any()):
            loss = loss + duration_weight * nn.functional.mse_loss(pred_s[has_s], seconds[has_s])
        return loss

    # -- prediction ------------------------------------------------------------------------
    @torch.inference_mode()
    def predict(self, texts: Sequence[str], batch_size: int = 64
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bucket probabilities [n, buckets], log tokens [n], log seconds [n]) for `texts`."""
        probs, log_t, log_s = [], [], []
        ids = self.encode(texts)
        with torch_threads(self.threads):
            for start in range(0, len(ids), batch_size):
                input_ids, mask = self._batch(ids[start:start + batch_size])
                logits, pred_t, pred_s = self.net(input_ids, mask)
                probs.append(torch.softmax(logits, -1).numpy())
                log_t.append((pred_t * self.tokens_std + self.tokens_mean).numpy())
                log_s.append((pred_s * self.seconds_std + self.seconds_mean).numpy())
        return np.concatenate(probs), np.concatenate(log_t), np.concatenate(log_s)

    # -- files -----------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Write `encoder/` (a complete BERT checkpoint with the tokenizer, reusable on its
        own) and `heads.safetensors`; returns the settings to keep in predictor.json."""
        # safetensors.torch loads torch: start-up cost
        from safetensors.torch import save_file

        d = Path(directory)
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar in our output
        self.net.encoder.save_pretrained(str(d / ENCODER_DIR), safe_serialization=True)
        self.tokenizer.save_pretrained(str(d / ENCODER_DIR))
        heads = {f"bucket_head.{k}": v.contiguous() for k, v in
                 self.net.bucket_head.state_dict().items()}
        for name in ("tokens_head", "seconds_head"):
            heads.update({f"{name}.{k}": v.contiguous() for k, v in
                          getattr(self.net, name).state_dict().items()})
        save_file(heads, str(d / HEADS_FILE))
        return {"max_length": self.max_length, "seconds_mean": self.seconds_mean,
                "seconds_std": self.seconds_std, "tokens_mean": self.tokens_mean,
                "tokens_std": self.tokens_std, "encoder": ENCODER_DIR, "heads": HEADS_FILE}

    @classmethod
    def load(cls, directory: str | os.PathLike[str], settings: dict[str, Any],
             n_buckets: int) -> NeuralModel:
        from safetensors.torch import load_file

        d = Path(directory)
        hf_logging.disable_progress_bar()  # no "Loading weights" bar per load
        encoder_dir = d / settings.get("encoder", ENCODER_DIR)
        tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
        encoder = BertModel.from_pretrained(str(encoder_dir), add_pooling_layer=False)
        net = Heads(encoder, n_buckets)
        heads = load_file(str(d / settings.get("heads", HEADS_FILE)))
        for name in ("bucket_head", "tokens_head", "seconds_head"):
            getattr(net, name).load_state_dict({k.split(".", 1)[1]: v for k, v in heads.items()
                                                if k.startswith(f"{name}.")})
        return cls(net, tokenizer, int(settings["max_length"]),
                   float(settings["seconds_mean"]), float(settings["seconds_std"]),
                   float(settings["tokens_mean"]), float(settings["tokens_std"]))

    def describe(self) -> dict[str, Any]:
        c = self.net.encoder.config
        n = sum(p.numel() for p in self.net.parameters())
        return {"layers": c.num_hidden_layers, "hidden": c.hidden_size,
                "heads": c.num_attention_heads, "vocab": c.vocab_size, "parameters": n}
