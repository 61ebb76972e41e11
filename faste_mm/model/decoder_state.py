"""The per-batch state that flows through the decoder layer loop, and the one gather that
compresses it. Built by a backbone adapter, advanced by the runner, read by compressor policies.
After compression the runner may pack it (`PackedState`) to run the remaining layers unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True, slots=True)
class DecoderState:
    """Everything a decoder layer needs for B right-padded rows, token-aligned on dim 1.

    The readout token of row b sits at `lengths[b] - 1`; every valid position before it is prefix.
    `cos`/`sin` hold each token's rotary embedding at its ORIGINAL position, so a gathered state
    keeps RoPE intact without position ids. `visual_rank` maps a visual token to its row in the
    DeepStack features (-1 elsewhere), which keeps DeepStack correct after compression.
    """

    hidden: torch.Tensor  # [B, T, H]
    cos: torch.Tensor  # [B, T, D_h]
    sin: torch.Tensor  # [B, T, D_h]
    valid: torch.Tensor  # [B, T] bool
    lengths: torch.Tensor  # [B]
    source_index: torch.Tensor  # [B, T] original token index of each slot
    visual_rank: torch.Tensor | None = None  # [B, T] int64, -1 for non-visual tokens
    deepstack: tuple[torch.Tensor, ...] | None = None  # per DeepStack layer: [n_visual, H]

    @property
    def readout_index(self) -> torch.Tensor:
        return self.lengths - 1  # [B]

    @property
    def prefix_mask(self) -> torch.Tensor:
        """[B, T] True on valid positions before the readout."""
        positions = torch.arange(self.hidden.shape[1], device=self.hidden.device)
        return positions[None, :] < self.readout_index[:, None]

    @property
    def visual_mask(self) -> torch.Tensor | None:
        return None if self.visual_rank is None else self.visual_rank >= 0

    def readout_hidden(self) -> torch.Tensor:
        """[B, H] hidden state of each row's readout token."""
        rows = torch.arange(self.hidden.shape[0], device=self.hidden.device)
        return self.hidden[rows, self.readout_index]

    def with_hidden(self, hidden: torch.Tensor) -> "DecoderState":
        return replace(self, hidden=hidden)

    def gather(self, index: torch.Tensor, lengths: torch.Tensor) -> "DecoderState":
        """Keep the slots in `index` [B, T'] (positions past `lengths` are padding).

        One index tensor selects hidden states, cos/sin, source positions and the visual map;
        the validity mask is rebuilt from the new lengths.
        """
        width = index.shape[1]
        valid = torch.arange(width, device=index.device)[None, :] < lengths[:, None]  # [B, T']

        def take(t: torch.Tensor) -> torch.Tensor:
            return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))

        visual_rank = None
        if self.visual_rank is not None:
            visual_rank = torch.where(valid, self.visual_rank.gather(1, index), -1)
        return DecoderState(
            hidden=take(self.hidden),
            cos=take(self.cos),
            sin=take(self.sin),
            valid=valid,
            lengths=lengths,
            source_index=torch.where(valid, self.source_index.gather(1, index), -1),
            visual_rank=visual_rank,
            deepstack=self.deepstack,
        )

    def pack(self) -> "PackedState":
        """The valid tokens only, rows back to back (right padding keeps each row contiguous).
        Its host reads (the lengths, the boolean selection) happen once, at the compression step."""
        valid = self.valid
        lengths = self.lengths
        offsets = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))  # int64
        return PackedState(
            hidden=self.hidden[valid],
            cos=self.cos[valid],
            sin=self.sin[valid],
            cu_seqlens=offsets.to(torch.int32),
            offsets=offsets,
            lengths=tuple(lengths.tolist()),
            visual_rank=None if self.visual_rank is None else self.visual_rank[valid],
            deepstack=self.deepstack,
        )


@dataclass(frozen=True, slots=True)
class PackedState:
    """B rows without padding: one stream of N tokens, row b at cu_seqlens[b]:cu_seqlens[b+1].

    Offers what the layers after compression read from a `DecoderState` (hidden, RoPE, the
    visual map for DeepStack, the readout rows), for variable-length attention kernels.
    """

    hidden: torch.Tensor  # [N, H]
    cos: torch.Tensor  # [N, D_h]
    sin: torch.Tensor  # [N, D_h]
    cu_seqlens: torch.Tensor  # [B + 1] int32 row offsets (flash-attn)
    offsets: torch.Tensor  # the same as int64, made once (jagged nested tensors, the readout)
    lengths: tuple[int, ...]  # host copy of the row lengths, for kernels that walk the rows
    visual_rank: torch.Tensor | None = None  # [N]
    deepstack: tuple[torch.Tensor, ...] | None = None

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    @property
    def readout_index(self) -> torch.Tensor:
        return self.offsets[1:] - 1  # [B] each row's last token

    @property
    def visual_mask(self) -> torch.Tensor | None:
        return None if self.visual_rank is None else self.visual_rank >= 0

    def readout_hidden(self) -> torch.Tensor:
        return self.hidden[self.readout_index]  # [B, H]

    def with_hidden(self, hidden: torch.Tensor) -> "PackedState":
        return replace(self, hidden=hidden)
