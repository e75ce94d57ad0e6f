"""MindCluster TaskD's import paths, served by recoverd (docs/compat.md, "Import paths").

Only what MindCluster's users import is here: ``taskd.python.toolkit.recover_module.recover_manager``
(``DLRecoverManager`` and its module-level helpers), its ``pb`` module, and
``taskd.python.framework.agent.ms_mgr.msrun_plugin.MSRunPlugin``. ``taskd.api`` is deliberately
absent: msrun tries ``taskd.api.taskd_agent_api`` first, and its ImportError is what sends msrun to
``MSRunPlugin``. Installing recoverd next to a real MindCluster TaskD makes the two ``taskd``
packages clash (whichever is installed last wins); install one or the other.
"""
