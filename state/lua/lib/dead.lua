-- dead(state): a sandbox record's state is final (killed, failed, lost).
local function dead(st) return st == 'killed' or st == 'failed' or st == 'lost' end
