"""The composition root's factories, one module per family of ports: each turns Settings (or a store) into
the adapter a port needs, so the shells and the library API get an adapter without naming one.

`harness.config` builds the whole Runtime from these; a command that needs one piece (an archiver, the
signer, a sandbox server) imports that piece's module alone. The read side (the store and the views over
it) is `harness.stores`.
"""
