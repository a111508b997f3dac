"""Truncated Poisson sampling: each of n records in the batch independently with probability q,
and a batch larger than B cut to a uniformly random subset of B records (docs/MATH.md 2.6).

Its dominating pair depends on n and B as well as q, which a
:class:`~pldlib.events.Sampled` event has no place for; the step is therefore the event
:class:`~pldlib.events.TruncatedPoissonGaussianEvent` (Gaussian noise; add, remove and
add_remove), built by a mechanism::

    Gaussian(sigma, q=q, sampling="truncated_poisson", batch_size=B, dataset_size=n)

The scheme is registered so that the name is one of :func:`~pldlib.sampling.scheme_names`
(the CLI's ``--sampling``, a sweep config's ``sampling:``); ``Sampled(event, q,
"truncated_poisson")`` is refused with a message saying so.
"""
from __future__ import annotations

from .base import SizedScheme, register


class TruncatedPoisson(SizedScheme):
    name = "truncated_poisson"
    summary = "Poisson at rate q, a batch larger than batch_size cut to a uniform subset of that size"
    relations = ("add", "remove", "add_remove")
    event_call = "TruncatedPoissonGaussianEvent(sigma, q, dataset_size, batch_size)"


register(TruncatedPoisson())
