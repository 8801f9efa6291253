"""Installing the engines a node is asked to have, on the node.

The control plane says which engines at which versions; everything else is
worked out here, because only the node knows it: which build fits its
processor and driver, which OS packages it lacks, and whether the result
runs. Nothing already on the machine is taken on trust: an engine counts as
installed when this package fetched it, checked it against its publisher's
checksum, unpacked it and watched it start.
"""
