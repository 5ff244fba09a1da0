"""Where the pipeline runs many submissions: ``local`` (threads on this machine) and
``cluster`` (Dask workers), both a :class:`~autograder.runners.local.Runner`."""
