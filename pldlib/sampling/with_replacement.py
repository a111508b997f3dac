"""Sampling with replacement: a batch of B independent uniform draws from the n records, so a
record may be in the batch several times (docs/MATH.md 2.7).

The number of draws of the protected record is K ~ Bin(B, 1/n) and each draw moves the sum
by at most two clipping norms (the draw would otherwise have been another record), so the
step's pair depends on B and n, not on q = B/n alone: a :class:`~pldlib.events.Sampled` event
has no place for them, and the step is the event
:class:`~pldlib.events.WithReplacementGaussianEvent` (Gaussian noise), built by a mechanism::

    Gaussian(sigma, sampling="with_replacement", batch_size=B, dataset_size=n)

Add and remove: the exact pair P = sum_k Bin(B, 1/n)(k) N(2k, sigma^2), Q = N(0, sigma^2) (and
its reverse).  Substitution: a certified upper bound (not tight) and that exact pair as the
lower bound.  The scheme is registered so that the name is one of
:func:`~pldlib.sampling.scheme_names` (the CLI's ``--sampling``, a sweep config's
``sampling:``); ``Sampled(event, q, "with_replacement")`` is refused with a message saying so.
"""
from __future__ import annotations

from .base import SizedScheme, register


class WithReplacement(SizedScheme):
    name = "with_replacement"
    summary = "a batch of batch_size independent uniform draws (with replacement) from dataset_size records"
    relations = ("add", "remove", "add_remove", "substitution")
    event_call = "WithReplacementGaussianEvent(sigma, dataset_size, batch_size)"


register(WithReplacement())
