"""Pure decisions over plain records: what is an orphan, what is protected, what retention owes."""
