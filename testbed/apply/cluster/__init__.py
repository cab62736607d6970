"""A run across servers, from this machine: reaching them (``ssh``), ``doctor --cluster``
(``doctor``), a server's share of a run seen from the coordinator (``remote_share``) and a
share's crossing links as VXLAN devices (``tunnel``)."""
