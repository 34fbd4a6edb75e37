#!lua
-- timers_grow
--
-- timers_set for changes that add timers: refused when Redis is at its maxmemory.
--#include timers_set
