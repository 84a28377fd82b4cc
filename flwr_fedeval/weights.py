"""Flat vectors of a model's weights: the layout shared by clients and the server.

Secure aggregation encrypts one flat vector per client; :class:`WeightLayout`
records the shapes and dtypes of the arrays so that the server can restore the
aggregate exactly (Walskaar et al. 2023, §3.3: flatten, encrypt, and reshape
the aggregate). Numpy only: used by the ClientApp side
(:mod:`flwr_fedeval.clients`) and by the strategies alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["WeightLayout"]


@dataclass(frozen=True)
class WeightLayout:
    """Shapes and dtypes of a model's weight arrays, in Keras order.

    Attributes
    ----------
    shapes : tuple of tuple of int
    dtypes : tuple of str
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    @classmethod
    def of(cls, arrays: list[np.ndarray]) -> WeightLayout:
        """The layout of a list of arrays."""
        return cls(
            shapes=tuple(tuple(int(d) for d in a.shape) for a in arrays),
            dtypes=tuple(np.asarray(a).dtype.str for a in arrays),
        )

    @property
    def size(self) -> int:
        """Total number of scalars (the unpadded vector length)."""
        return int(sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes))

    def flatten(self, arrays: list[np.ndarray], *, pad_to_multiple: int | None = None) -> np.ndarray:
        """Concatenate ``arrays`` into one float64 vector, zero-padded.

        Parameters
        ----------
        arrays : list of ndarray
            Must match this layout's shapes.
        pad_to_multiple : int, optional
            Pad with zeros to the next multiple of this (e.g. ring dimension n).

        Returns
        -------
        ndarray of shape (padded_size,), dtype float64
            Lossless for float32/float16 weights.

        Raises
        ------
        ValueError
            On a shape mismatch or a non-finite weight (NaN/inf never enters
            an aggregate).
        """
        if len(arrays) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} arrays, got {len(arrays)}")
        for k, (a, shape) in enumerate(zip(arrays, self.shapes)):
            if tuple(np.shape(a)) != shape:
                raise ValueError(f"array {k} has shape {np.shape(a)}, layout expects {shape}")
        if pad_to_multiple is not None and pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        size = self.size
        padded = size if pad_to_multiple is None else -(-size // pad_to_multiple) * pad_to_multiple
        # one float64 buffer, each array cast into its slice: no per-array float64 copy
        flat = np.empty(padded, dtype=np.float64)
        pos = 0
        for a in arrays:
            a = np.asarray(a)
            if not np.isfinite(a).all():
                bad = pos + int(np.flatnonzero(~np.isfinite(a.ravel()))[0])
                raise ValueError(f"weights contain NaN or inf (first at flat index {bad})")
            flat[pos : pos + a.size] = a.ravel()
            pos += a.size
        flat[pos:] = 0.0
        return flat

    def difference(self, new: list[np.ndarray], old: list[np.ndarray]) -> np.ndarray:
        """``flatten(new) - flatten(old)`` (float64, unpadded) in one buffer: each pair of arrays is cast
        into its slice and subtracted there, with no float64 copy of either list.

        Raises
        ------
        ValueError
            As :meth:`flatten`, for either list.
        """
        for arrays in (new, old):
            if len(arrays) != len(self.shapes):
                raise ValueError(f"expected {len(self.shapes)} arrays, got {len(arrays)}")
            for k, (a, shape) in enumerate(zip(arrays, self.shapes)):
                if tuple(np.shape(a)) != shape:
                    raise ValueError(f"array {k} has shape {np.shape(a)}, layout expects {shape}")
        flat = np.empty(self.size, dtype=np.float64)
        pos = 0
        for a, b in zip(new, old):
            a, b = np.asarray(a), np.asarray(b)
            for x in (a, b):
                if not np.isfinite(x).all():
                    bad = pos + int(np.flatnonzero(~np.isfinite(x.ravel()))[0])
                    raise ValueError(f"weights contain NaN or inf (first at flat index {bad})")
            part = flat[pos : pos + a.size]
            part[...] = a.ravel()
            part -= b.ravel()  # cast to float64 element by element: exact for float32 and float16
            pos += a.size
        return flat

    def unflatten(self, vector: np.ndarray) -> list[np.ndarray]:
        """Split a (possibly padded) vector back into arrays of this layout.

        Integer arrays (e.g. BatchNorm's ``num_batches_tracked``) are rounded to the nearest integer, not
        truncated: an aggregate's 2.9999999 is 3. Every part is an ndarray of its layout's shape and
        dtype, a 0-d one included (PyTorch's ``num_batches_tracked`` has shape ``()``).

        Raises
        ------
        ValueError
            If the vector is shorter than :attr:`size`, or its padding is not zero.
        """
        vector = np.asarray(vector)
        if vector.ndim != 1 or vector.size < self.size:
            raise ValueError(f"vector of shape {vector.shape} cannot hold {self.size} weights")
        if vector.size > self.size and np.any(vector[self.size :] != 0):
            raise ValueError("padding beyond the layout size is not zero")
        out, offset = [], 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            count = int(np.prod(shape, dtype=np.int64))
            part = vector[offset : offset + count].reshape(shape)
            if np.dtype(dtype).kind in "iub" and part.dtype.kind == "f":
                part = np.rint(part)  # an integer tensor (a step counter) rounds: 2.9999999 is 3, not 2
            # np.rint of a 0-d array (PyTorch's BatchNorm num_batches_tracked) is a numpy scalar: keep an ndarray
            out.append(np.asarray(part, dtype=np.dtype(dtype)))
            offset += count
        return out
