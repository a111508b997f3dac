"""Other libraries' accountants behind pldlib's :class:`~pldlib.methods.Accountant` interface.

They are registered methods of kind ``"peer"`` (:mod:`pldlib.methods`), imported
only when used, and listed by :func:`~pldlib.methods.method_names` only where
their package is installed (``pip install 'pldlib[peers]'``).  Their numbers are
the other library's, as it states them; pldlib certifies none of them.

==============  ==============================  ==========================================
method          events                          relations
==============  ==============================  ==========================================
dp_accounting   Gaussian, Laplace; unsampled    add_remove; substitution (Gaussian only: its
                or Poisson-sampled              REPLACE_ONE); add and remove only unsampled
                                                (symmetric pairs: equal to add_remove); no
                                                sampling without replacement
prv_accountant  Gaussian unsampled or Poisson;  unsampled: add, remove, add_remove
                Laplace unsampled               (symmetric); Poisson: remove only (its
                                                subsampled Gaussian is the remove pair)
==============  ==============================  ==========================================

Opacus' accountants are not wrapped: Opacus needs PyTorch, which the test
environment does not install.  Everything else raises :class:`~pldlib.methods.UnsupportedEventError` with the reason.
"""
