"""Adapters to the accountant interfaces people already call (docs/MATH.md section 9).

* :mod:`pldlib.interop.dp_accounting` -- a ``dp_accounting.PrivacyAccountant``
  backed by any certified pldlib method, and converters between dp_accounting's
  ``DpEvent``s and pldlib events (what JAX Privacy and TF Privacy take);
* :mod:`pldlib.interop.opacus` -- an accountant with Opacus' accountant contract
  and ``get_noise_multiplier`` with Opacus' signature (no torch needed).

Neither is imported by ``import pldlib``: import the submodule you need
(``dp_accounting`` must be installed for the first one; the second needs
nothing beyond pldlib).
"""
