# SPDX-License-Identifier: BSD-2-Clause
"""The receive path (front end, classification, CM, ACK parsing): later issues."""
