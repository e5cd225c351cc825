"""The control store: the control schema's tables (``control``), the plan document and its
id (``plan_document``), stored plans (``plans``) and the ledger of approvals and runs
(``ledger``)."""
