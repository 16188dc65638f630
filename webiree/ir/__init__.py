"""The ground floor: the kernel IR (`kir`) and the canonical program (`program`).

Both the compiler and the code generator stand on these; this package imports
nothing else of webiree.
"""
