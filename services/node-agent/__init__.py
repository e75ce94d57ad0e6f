"""The node agent: launches and watches the local ranks, answers the recovery protocol for them."""
